"""Admission for every protocol: a client's share of the queue (service.engine.clients), a
key's rate, the request's deadline against the queue's measured delay, then the dispatcher's
queue bound (service.engine.bounds); and what a client's end and the server's stop change of
what was admitted (`leave`, `behind`, `keep_admitted`). It says
whether texts were admitted, or why not (a `Refusal`); each protocol writes its own answer
(HTTP and KServe: protocols/admit.py; binary frames: protocols/binary.py). Also the map of a
failed text's status to the HTTP code every protocol answers or counts it under.

It takes one type from every protocol, the `Ask` (service/engine/requests.py) each builds
where its decoding ends. It knows the dispatcher, the keys and the tracing (through `Tracer` and
`Trace`: service/ops/ sits above the engine and reads it), and asks the server only why it
refuses; it never sees the server itself, nor any protocol's types.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from ringserve.service.engine.bounds import FULL
from ringserve.service.engine.clients import Client, behind, drop, make_room
from ringserve.service.engine.dispatcher import Dispatcher, Result, text_cost
from ringserve.service.engine.requests import Ask, Group
from ringserve.service.engine.tenants import INTERACTIVE, KeyRing, Tenant
from ringserve.shm import layout as L

Done = Callable[[list[Result]], None]


class Trace(Protocol):
    """One sampled request's span, as admission and the protocols mark it; times are monotonic
    ns (service/ops/tracing.py's RequestTrace)."""

    def admitted(self, now_ns: int, texts: int, text_bytes: int) -> None: ...
    def refused(self, now_ns: int, why: str) -> None: ...
    def answered(self, results: list[Result], now_ns: int) -> None: ...
    def written(self, status: int, now_ns: int) -> None: ...


class Tracer(Protocol):
    """What starts a request's span when tracing is on, and sends the last ones at the stop
    (service/ops/tracing.py's Tracing)."""

    def start(
        self,
        name: str,
        protocol: str,
        received_ns: int,
        traceparent: bytes | None = None,
        tracestate: bytes | None = None,
        attributes: dict[str, Any] | None = None,
    ) -> Trace | None: ...
    def shutdown(self) -> None: ...


STATUS_HTTP = {
    L.STATUS_OK: 200,
    L.STATUS_BAD_REQUEST: 400,
    L.STATUS_OVERLOADED: 503,
    L.STATUS_DEADLINE: 504,
    L.STATUS_INTERNAL: 500,
    L.STATUS_TOO_LONG: 413,
    L.STATUS_RATE_LIMITED: 429,
    L.STATUS_CANCELLED: 499,  # nginx's "client closed request": nobody reads the answer
}
STATUS_MESSAGE = {
    L.STATUS_BAD_REQUEST: "text is empty or not valid UTF-8",
    L.STATUS_OVERLOADED: "overloaded",
    L.STATUS_DEADLINE: "request deadline passed",
    L.STATUS_CANCELLED: "the client cancelled the request",
    L.STATUS_INTERNAL: "internal error",
}


def first_failure(results: list[Result]) -> Result | None:
    for r in results:
        if r.status != L.STATUS_OK:
            return r
    return None


def too_long(failed: Result) -> tuple[str, dict[str, int]]:
    """The message and fields of a 413 for a text over the model's max_length (or, for token
    vectors, over what one answer carries)."""
    if failed.flags & L.RSP_TOKEN_LABELS:
        msg = (
            f"text has {failed.tokens} tokens: the labels of at most {failed.limit} fit one "
            "answer (half the response ring: send a shorter text, or raise --ring-slots)"
        )
        return msg, {"tokens": failed.tokens, "max_tokens": failed.limit}
    if failed.flags & L.RSP_TOKENS:
        msg = (
            f"text has {failed.tokens} tokens: the token vectors of at most {failed.limit} fit "
            "one answer (half the response ring: send a shorter text, or raise --ring-slots)"
        )
        return msg, {"tokens": failed.tokens, "max_tokens": failed.limit}
    if failed.flags & L.RSP_WINDOWED:
        if not failed.windows:
            msg = f"text pair has {failed.tokens} tokens, and its first text leaves no room "
            return msg + "for windows of the second", {"tokens": failed.tokens}
        msg = (
            f"text has {failed.tokens} tokens: {failed.windows} windows, over --max-windows "
            f"{failed.limit}"
        )
        return msg, {
            "tokens": failed.tokens,
            "windows": failed.windows,
            "max_windows": failed.limit,
        }
    msg = f"text has {failed.tokens} tokens, over the model's max_length of {failed.limit}"
    return msg + " (truncate: false)", {"tokens": failed.tokens, "max_length": failed.limit}


def failure(failed: Result) -> tuple[int, str]:
    """The HTTP status and message of a failed text, for every protocol that maps them."""
    if failed.status == L.STATUS_TOO_LONG:
        return 413, too_long(failed)[0]
    return STATUS_HTTP.get(failed.status, 500), STATUS_MESSAGE.get(failed.status, "internal error")


@dataclass(frozen=True, slots=True)
class Refusal:
    """Why texts were not admitted: the HTTP code (404 a model that is not open, 429 over the
    key's rate, 503 the queue, 504 a deadline the queue's delay already passes), its message,
    and the seconds a client should wait (Retry-After; 0 for a 404 or a 504)."""

    code: int
    message: str
    retry_after_s: int


class Admission:
    """Admits texts to the dispatcher, or refuses them at once with the reason: a model that is
    not open (404), the key's rate (429), a deadline the queue cannot meet (504), then the
    queue (503)."""

    def __init__(
        self,
        dispatcher: Dispatcher,
        refusal: Callable[[], str],
        timeout_s: float,
        keys: KeyRing | None = None,
        tracing: Tracer | None = None,
        share: int = 0,
    ) -> None:
        self.dispatcher = dispatcher
        self.refusal = refusal  # why the dispatcher refuses now: draining, full, no worker
        self.timeout_s = timeout_s  # the deadline of a request that sets none
        self.keys = keys  # with --api-key(s): the tenants' counts
        self.tracing = tracing  # when tracing is on: each request's span starts here
        # The group the last admitted request became: read at once (on the same loop turn) by
        # a protocol that may cancel it (gRPC's ModelInfer, on its client's RST_STREAM).
        self.last_group: Group | None = None
        # The texts one client may hold while others' are in flight (clients.share_of; 0: no
        # share, only the queue's bounds), and the texts dropped because their client had gone.
        self.share = share
        self.dropped = 0

    def level(self, tenant: Tenant | None, asked: int | None, model: int = 0) -> int:
        """The priority texts are batched at: the lowest of the model's (a config file table's
        `priority`), the key's and the request's; so a key or a request may only lower it."""
        level = tenant.priority_for(asked) if tenant is not None else asked or INTERACTIVE
        return max(level, self.dispatcher.table.priority(model))

    def submit(
        self,
        ask: Ask,
        done: Done,
        tenant: Tenant | None,
        trace: Trace | None = None,
        client: Client | None = None,
    ) -> Refusal | None:
        """Admit a request's texts whole, or refuse them at once (the Refusal). `done` gets
        the results, whatever their status, once every text is answered. The texts are batched
        at the key's priority, or the lower one the request asked for. `client`: the
        connection it came on, held to its share of the queue while others' texts are in
        flight, and whose waiting texts `leave` drops."""
        d = self.dispatcher
        model = ask.model
        if not d.table.is_open(model):
            return self.unknown(model, trace)
        if client is not None and self.over_share(client, len(ask.payloads)):
            if trace is not None:
                trace.refused(d.clock(), "overloaded")
            d.refuse(len(ask.payloads), model)
            message = f"over this connection's share of the queue ({self.share} texts while "
            return Refusal(503, message + "other clients' texts are in flight)", 1)
        now = d.clock()
        if tenant is not None and not tenant.take(now):
            return self.over_rate(tenant, 1, now, trace)
        level = self.level(tenant, ask.priority, model)
        late = self.late(ask.deadline, model, level, now, trace)
        if late is not None:
            return late
        if trace is not None:
            done = traced(done, trace, d.clock)
        name = tenant.name if tenant is not None else ""
        texts = ask.payloads
        full = self.share and d.depth + len(texts) > d.max_queue  # (cheap: then room() says)
        if full and d.room(len(texts), True, level, model) < len(texts) and d.why == FULL:
            make_room(d, client, len(texts), self.share)  # a client past its share gives way
        admitted = d.clock()  # before submit: a worker may start on the texts before it returns
        group = d.submit(
            texts, ask.deadline, done, ask.protocol, ask.task, level, name, model, ask.options,
            client,
        )  # fmt: skip
        if group is None:
            if not d.table.is_open(model):  # closed meanwhile (never, on the one loop)
                return self.unknown(model, trace)
            if trace is not None:
                trace.refused(d.clock(), "overloaded")
            return Refusal(503, self.refusal(), 1)
        if client is not None:
            client.texts += len(texts)
        if self.keys is not None and tenant is not None:
            self.keys.admitted(name, len(texts), level)
        if trace is not None:
            trace.admitted(admitted, len(texts), sum(len(t) for t in texts))
        self.last_group = group
        return None

    def cancel(self, group: Group) -> int:
        """The client of an admitted group left (a gRPC call reset, its connection lost): its
        texts no worker has taken are answered STATUS_CANCELLED now and never reach one; those
        a worker holds run on. Returns how many were dropped."""
        d = self.dispatcher
        first = group.first_id
        dropped = [
            r
            for r in map(d.inflight.get, range(first, first + len(group.results)))
            if r is not None and r.group is group and r.worker is None
        ]
        for r in dropped:
            with contextlib.suppress(ValueError):
                d.waiting.remove(r)
            d.answers.complete(r, Result(L.STATUS_CANCELLED))
        return len(dropped)

    def submit_each(
        self,
        ask: Ask,
        on_admit: Callable[[int, int], Done],
        tenant: Tenant | None,
        client: Client | None = None,
    ) -> tuple[int, int] | Refusal:
        """Independent texts (binary frames), in order: those within the key's rate and the
        queue's room are admitted as one group, at the key's priority, with the ask's one
        options byte in every record. `on_admit(k, level)` makes the group's callback, before a
        worker can start on it. Returns (k, within): texts[:k] admitted, texts[k:within]
        refused by the queue, texts[within:] over the rate; or a Refusal, none admitted: 404
        when the model is not open, 504 when the queue's delay already passes the deadline."""
        d = self.dispatcher
        model, texts = ask.model, ask.payloads
        if not d.table.is_open(model):
            return self.unknown(model)
        within = len(texts)
        if tenant is not None:
            within = tenant.take(d.clock(), within)
            if within < len(texts) and self.keys is not None:
                self.keys.counts(tenant.name).limited += len(texts) - within
            if not within:
                return 0, 0
        level = self.level(tenant, ask.priority, model)
        late = self.late(ask.deadline, model, level, d.clock())
        if late is not None:
            return late
        costs = [text_cost(t, d.max_tokens) for t in texts[:within]]
        k = d.room(within, whole=False, priority=level, model=model)
        full = k < within and self.share and d.why == FULL
        if full and make_room(d, client, within - k, self.share):  # one past its share gives way
            k = d.room(within, whole=False, priority=level, model=model)
        if client is not None and k and self.over_share(client, k):
            k = max(0, min(k, self.share - client.texts))
        if k:
            name = tenant.name if tenant is not None else ""
            done = on_admit(k, level)
            sent = texts[:k] if k < len(texts) else texts
            d.admit(sent, costs[:k], ask.deadline, done, ask.protocol, ask.task, level, name,
                    model, ask.options, client)  # fmt: skip
            if client is not None:
                client.texts += k
            if tenant is not None and self.keys is not None:
                self.keys.admitted(tenant.name, k, level)
        if k < within:
            d.refuse(within - k, model)
        return k, within

    def late(
        self, deadline: int, model: int, level: int, now: int, trace: Trace | None = None
    ) -> Refusal | None:
        """504 at once for a request whose deadline the queue's measured delay already passes:
        it would only wait to expire."""
        if not deadline:
            return None
        delay = self.dispatcher.delay_ns(model, level, now)
        if not delay or now + delay < deadline:
            return None
        if trace is not None:
            trace.refused(now, "deadline")
        message = (
            f"the queue's measured delay of {delay / 1e6:.0f} ms already passes the request's "
            f"deadline ({max(0, deadline - now) / 1e6:.0f} ms left)"
        )
        return Refusal(504, message, 0)

    def over_share(self, client: Client, n: int) -> bool:
        """`n` more texts take the client past its share of the queue while other clients'
        texts are in flight (alone, it may fill the queue: a burst on an idle server)."""
        over = self.share and client.texts + n > self.share
        return bool(over) and self.dispatcher.depth > client.texts

    def leave(self, client: Client) -> int:
        """The client's connection was lost: its texts still waiting for a worker are dropped
        (clients.drop), never run; what a worker holds is run and its answer discarded."""
        n = drop(self.dispatcher, client)
        self.dropped += n
        return n

    def behind(self, client: Client) -> int:
        """The client shut its sending side: its waiting texts go behind every other client's
        until its protocol knows whether it reads on (clients.behind)."""
        return behind(self.dispatcher, client)

    def keep_admitted(self) -> None:
        """The server stops: every text admitted so far is answered, never refused for the
        queue's delay (bounds.queue_by) while the drain runs; a deadline still holds."""
        for r in self.dispatcher.inflight.values():
            r.queue_by_ns = 0

    def refuse(self, n: int) -> None:
        """Count texts a protocol refused itself (binary frames past a connection's bound of
        answers owed) with the queue's refusals."""
        self.dispatcher.refuse(n)

    def unknown(self, model: int, trace: Trace | None = None) -> Refusal:
        """A model that is not open (never loaded, or unloaded): 404, as for a name not known."""
        if trace is not None:
            trace.refused(self.dispatcher.clock(), "unknown_model")
        return Refusal(404, f"unknown model: {self.dispatcher.table.name(model)}", 0)

    def over_rate(self, tenant: Tenant, n: int, now: int, trace: Trace | None = None) -> Refusal:
        if self.keys is not None:
            self.keys.counts(tenant.name).limited += n
        if trace is not None:
            trace.refused(now, "rate_limited")
        message = f"over the key's rate of {tenant.rate:g} requests/s"
        return Refusal(429, message, tenant.retry_after_s())


def traced(done: Done, trace: Trace, clock: Callable[[], int]) -> Done:
    """`done`, after the trace has seen the answers."""

    def answered(results: list[Result]) -> None:
        trace.answered(results, clock())
        done(results)

    return answered
