"""rpc/reply.py's Reply: the one hand-off of a ModelInfer's answer from the loop to the gRPC
thread that waits for it, given once with the answer or the error."""

from __future__ import annotations

import threading

import pytest
from ringserve.service.protocols.http import HttpError
from ringserve.service.protocols.rpc.reply import Reply


def test_the_waiting_thread_gets_the_answer_given_from_another() -> None:
    reply = Reply()
    got: list[object] = []
    waiter = threading.Thread(target=lambda: got.append(reply.wait()))
    waiter.start()
    reply.give("answer")
    waiter.join(10)
    assert got == ["answer"] and not waiter.is_alive()


def test_an_error_given_is_raised_on_the_waiting_thread() -> None:
    reply = Reply()
    reply.fail(HttpError(404, "unknown model"))
    with pytest.raises(HttpError) as exc:
        reply.wait()
    assert exc.value.status == 404


def test_a_reply_given_before_the_wait_is_not_lost() -> None:
    reply = Reply()
    reply.give(42)
    assert reply.wait() == 42
