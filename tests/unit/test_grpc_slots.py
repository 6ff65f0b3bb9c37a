"""rpc/slots.py's request_slots: a call gRPC core has taken while grpcio's threaded server has
no request outstanding for it is cancelled by the server's stop (grpc/grpc#41785); with the
requests kept outstanding, core matches every call at once and the graceful stop serves it."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import grpc
from ringserve.service.protocols.rpc.slots import Owed, request_slots


def echo(request: bytes, context: grpc.ServicerContext) -> bytes:
    return b"ok:" + request


def test_a_stop_serves_every_call_core_has_taken() -> None:
    server = grpc.server(ThreadPoolExecutor(4), options=[("grpc.so_reuseport", 0)])
    method = grpc.unary_unary_rpc_method_handler(echo)
    server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler("t.S", {"M": method})])
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    assert request_slots(server, 16)
    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    try:
        grpc.channel_ready_future(channel).result(5)
        call = channel.unary_unary("/t.S/M")
        state = server._state  # grpcio's private state, as request_slots reads it
        # Holding the server's lock keeps its poll thread from asking core for another call:
        # with grpcio's one request, the second and third call would wait in core, and the stop
        # below cancelled them.
        with state.lock:
            futures = [call.future(str(i).encode(), timeout=5) for i in range(3)]
            time.sleep(0.3)  # all three reach core
            stopped = server.stop(5)
        assert [f.result() for f in futures] == [b"ok:0", b"ok:1", b"ok:2"]
        assert stopped.wait(5)
        assert isinstance(state.due, Owed) and not state.due  # every request accounted for
    finally:
        channel.close()
        server.stop(0)


def test_owed_counts_each_tag() -> None:
    owed = Owed({"a"})
    owed.add("a")
    owed.add("b")
    owed.remove("a")
    assert "a" in owed and owed
    owed.remove("a")
    owed.discard("b")
    assert not owed and "a" not in owed
    try:
        owed.remove("a")
    except KeyError:
        pass
    else:
        raise AssertionError("removing a tag not owed must raise, as a set does")
