"""Embedding routes through the answer cache (service/engine/cache.py): the texts answered
before are answered from it, the rest alone admitted, and an answer written from the JSON rows
the cache keeps, so a hit neither reaches the dispatcher nor writes a float again.

A route that writes its answer in two steps (`Written`: each text's row, then the answer around
the rows) has its rows kept in the cache under the route's `form`; any other answer (Cohere's,
a structure msgspec writes whole) is written from the kept vectors each time."""

from __future__ import annotations

from collections.abc import Callable, Hashable
from dataclasses import dataclass

from ringserve.service.engine.admission import STATUS_MESSAGE
from ringserve.service.engine.cache import AnswerCache, Entry, Key
from ringserve.service.engine.requests import Ask, Result
from ringserve.service.models.info import ModelInfo
from ringserve.service.protocols import admit
from ringserve.service.protocols.admit import latency_header
from ringserve.service.protocols.http import Exchange, HttpProtocol
from ringserve.service.request.options import asked_priority
from ringserve.service.views import FrontView
from ringserve.shm import layout as L

Answer = Callable[[list[Result]], bytes]  # the results of a request's texts, in order -> body


@dataclass(frozen=True)
class Written:
    """An embedding answer written in two steps, so that the cache can keep the first: `rows`
    writes each text's JSON (all the texts it is given in one pass, each row the same bytes
    whatever it was written with), `whole` the answer around the rows, given the tokens
    counted. `form` names everything a row depends on beyond its text's cache key (the route,
    its encoding, `dimensions`, `normalize`); a row is kept under it."""

    form: Hashable
    rows: Callable[[list[Result]], list[bytes]]
    whole: Callable[[list[bytes], int], bytes]

    def __call__(self, results: list[Result]) -> bytes:
        return self.whole(self.rows(results), sum(r.tokens for r in results))


def submit_embed(
    server: FrontView, info: ModelInfo, conn: HttpProtocol, ex: Exchange, ask: Ask, answer: Answer
) -> None:
    """Answer an embedding request's hits from the cache, one lookup each; admit only its
    misses (none: the answer is written at once), and keep their answers for next time."""
    cache = server.cache
    if not cache.capacity or not isinstance(ask.options, int):
        admit.submit(server.admission, conn, ex, ask, lambda rs: reply(conn, ex, answer(rs)))
        return
    # the headers are read (and a bad one refused) as admission reads them, hit or not
    ask.deadline = admit.deadline_ns(ex, server.admission.timeout_s)
    ask.priority = asked_priority(ex.headers.get(b"x-priority"), "X-Priority")
    fingerprint, model = info.manifest.fingerprint, info.index
    keys = [(fingerprint, model, ask.options, p) for p in ask.payloads]
    found = [cache.get(k) for k in keys]
    missing = [i for i, e in enumerate(found) if e is None]
    if not missing:
        ex.model = server.admission.dispatcher.names.get(model, "")  # counted under it
        if ask.deadline <= conn.clock():  # as the queue's expiry would answer it
            conn.respond_error(
                ex, 504, STATUS_MESSAGE[L.STATUS_DEADLINE], [latency_header(conn, ex)]
            )
            return
        reply(conn, ex, write(cache, keys, found, answer))  # type: ignore[arg-type]
        return
    generation = cache.generation(model)

    def merged(results: list[Result]) -> None:
        for i, r in zip(missing, results, strict=True):
            found[i] = cache.put(keys[i], r, generation) or Entry(r, 0)  # not kept: its own
        reply(conn, ex, write(cache, keys, found, answer))  # type: ignore[arg-type]

    ask.payloads = [ask.payloads[i] for i in missing]
    admit.submit(server.admission, conn, ex, ask, merged)


def write(cache: AnswerCache, keys: list[Key], entries: list[Entry], answer: Answer) -> bytes:
    """The answer to texts whose every entry is in hand. A Written answer takes each row the
    cache keeps in its form, and writes the others in one pass, keeping them."""
    results = [e.result for e in entries]
    if not isinstance(answer, Written):
        return answer(results)
    form = answer.form
    rows = [None if e.written is None else e.written.get(form) for e in entries]
    todo = [i for i, row in enumerate(rows) if row is None]
    if todo:
        for i, row in zip(todo, answer.rows([results[i] for i in todo]), strict=True):
            rows[i] = row
            cache.write(keys[i], entries[i], form, row)
    return answer.whole(rows, sum(r.tokens for r in results))  # type: ignore[arg-type]


def reply(conn: HttpProtocol, ex: Exchange, body: bytes) -> None:
    conn.respond(ex, 200, body, extra=[latency_header(conn, ex)])
