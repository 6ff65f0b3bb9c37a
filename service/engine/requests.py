"""A request's life in the front-end: what a client asked, whatever the wire (Ask), the texts
it sent (a Group of one-text Requests), their answers (Result), and the two lines they wait in
before a worker's ring (Waiting).

A request is one text. A client call with N texts is a Group of N requests answered by one
callback once the last answer is in, so a batch costs one pass through the loop, not N.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import msgspec
import numpy as np
from ringserve.shm import layout as L

# A text's cost in token-equivalents, estimated from its bytes before any tokenizer has seen it:
# about four bytes a token, plus a row's fixed share of a batch (special tokens, per-row work).
BYTES_PER_TOKEN = 4
ROW_COST = 8
INTERACTIVE = 0  # priorities (service.engine.tenants)
BULK = 1
# A request's options byte (shm.layout OPT_*: long text, embed): one for all its texts, or one
# a text (a KServe request asking for scores and vectors sends each text twice).
Options = int | Sequence[int]


class Ask(msgspec.Struct):
    """One client request as admission takes it, whatever the wire: every protocol builds it
    where its own decoding ends (a JSON route from its body's Struct, KServe from `Infer` or
    the protobuf message, a binary connection from its frames), and nothing after it knows the
    wire. A msgspec Struct: the cheapest typed record to build (measured here: 0.11 us, a
    slotted dataclass 0.23 us, a NamedTuple 0.35 us). HTTP's headers fill what a body leaves unset
    (protocols/admit.py `submit`): the deadline, then the priority."""

    payloads: list[bytes]  # one a text, as written into the ring: a pair joined by
    # PAIR_SEPARATOR, a prompt before an embedding's text
    options: Options = 0  # their options byte (shm.layout OPT_*), one for all or one a text
    task: str = "classify"  # what it counts under: classify, embed or rerank
    model: int = 0  # the model's wire index (ModelInfo.index)
    deadline: int = 0  # monotonic ns (0: none yet; HTTP's headers or the default set it)
    priority: int | None = None  # the priority asked for (None: the key's), never above it
    protocol: str = "http"  # what it is counted and traced under


def text_cost(payload: bytes, max_tokens: int) -> int:
    return min(max_tokens, len(payload) // BYTES_PER_TOKEN) + ROW_COST


class Holder(Protocol):
    """The worker a request was handed to, as a request sees it (an engine.link.WorkerLink)."""

    assigned: dict[int, Request]  # msg id -> request, in dispatch order


@dataclass(slots=True)
class Result:
    status: int  # shm.layout.STATUS_*
    label_id: int = 0
    scores: np.ndarray | None = None
    bucket: int = 0
    queued_us: int = 0
    model_us: int = 0
    flags: int = 0  # shm.layout.RSP_TRUNCATED, RSP_WINDOWED
    tokens: int = 0  # the text's token count before any cut (STATUS_TOO_LONG: too many)
    windows: int = 0  # windows scored (STATUS_TOO_LONG: windows it would need)
    limit: int = 0  # STATUS_TOO_LONG: max_length, or --max-windows when RSP_WINDOWED
    batch: int = 0  # the batch it ran in, shm.layout.pack_batch (rows, padded length, start)
    read_ns: int = 0  # when the front-end read the answer from its worker's ring
    # A token classifier's answer whole (RSP_TOKEN_LABELS): workers/token_entities.py unpacks it
    body: bytes | None = None

    @classmethod
    def from_ring(cls, aux: int, payload: bytes, read_ns: int) -> Result:
        """An answer as its worker wrote it into the response ring (shm.layout.RESPONSE)."""
        status, bucket, label, n, flags, _r, windows, limit, tokens, queued_us, model_us = (
            L.RESPONSE.unpack_from(payload)
        )
        scores = None
        if flags & L.RSP_TOKEN_LABELS:
            return cls(
                status, label, None, bucket, queued_us, model_us, flags, tokens, windows, limit,
                aux, read_ns, payload,
            )  # fmt: skip
        if status == L.STATUS_OK:
            count = n * windows if flags & L.RSP_TOKENS else n  # token vectors: k rows of n
            count = 2 * n if flags & L.RSP_SPARSE else count  # n ids (as u32 bits), n weights
            scores = np.frombuffer(payload, dtype="<f4", count=count, offset=L.RESPONSE_SIZE)
        return cls(
            status, label, scores, bucket, queued_us, model_us, flags, tokens, windows, limit,
            aux, read_ns,
        )  # fmt: skip


class Group:
    __slots__ = (
        "admitted_ns",
        "callback",
        "client",
        "first_id",
        "model",
        "model_name",
        "priority",
        "protocol",
        "remaining",
        "results",
        "started",
        "task",
        "tenant",
    )

    def __init__(
        self,
        n: int,
        callback: Callable[[list[Result]], None],
        protocol: str,
        admitted_ns: int,
        task: str = "classify",
        priority: int = INTERACTIVE,
        tenant: str = "",
        model: int = 0,
        model_name: str = "",
    ) -> None:
        self.results: list[Result | None] = [None] * n
        self.remaining = n
        self.callback = callback
        self.protocol = protocol
        self.admitted_ns = admitted_ns
        self.task = task  # classify, embed or rerank: what /v1/stats and /metrics count
        self.priority = priority  # INTERACTIVE or BULK (service.tenants)
        self.tenant = tenant  # the caller's tenant name ("" without --api-keys)
        self.model = model  # the model's wire index (shm.layout.request_meta): its lane
        self.model_name = model_name  # what metrics label it with
        self.started = False  # a worker took one of its texts: it is never refused after that
        self.first_id = 0  # its texts' request ids: first_id, first_id + 1, ... (`requests`)
        self.client: Any = None  # the engine.clients.Client that sent it (None: none counted)

    def requests(
        self,
        first_id: int,
        texts: list[bytes],
        costs: list[int],
        deadline_ns: int,
        options: Options = 0,
    ) -> list[Request]:
        """One request a text, numbered from first_id, each with its ring record's meta word
        (shm.layout.request_meta): its options, OPT_BULK for bulk (the worker batches
        interactive texts first too) and the model."""
        self.first_id = first_id
        bulk = L.OPT_BULK if self.priority == BULK else 0
        if isinstance(options, int):
            metas = [L.request_meta(options | bulk, self.model)] * len(texts)
        else:
            metas = [L.request_meta(o | bulk, self.model) for o in options]
        return [
            Request(first_id + i, t, deadline_ns, self, i, c, m)
            for i, (t, c, m) in enumerate(zip(texts, costs, metas, strict=True))
        ]


class Request:
    __slots__ = (
        "cost", "deadline_ns", "group", "id", "index", "meta", "payload", "queue_by_ns", "worker",
    )  # fmt: skip

    def __init__(
        self,
        rid: int,
        payload: bytes,
        deadline_ns: int,
        group: Group,
        index: int,
        cost: int,
        meta: int = 0,
    ):
        self.id = rid
        self.payload = payload  # the text as the protocol read it, written once into a ring
        self.meta = meta  # its options and model, the ring record's meta word
        self.deadline_ns = deadline_ns
        self.group = group
        self.index = index
        self.cost = cost
        self.worker: Holder | None = None
        # Admitted into a queue that was not fresh (bounds.queue_by): refused (503) if no worker
        # has taken it by then. 0: it waits as long as its deadline allows (a burst's texts).
        self.queue_by_ns = 0

    @property
    def model(self) -> int:
        """The model's wire index: only workers that hold it may take the text."""
        return self.group.model


class Waiting:
    """Admitted texts not yet in any ring, in two lines: interactive texts go first, bulk texts
    behind them, unless the oldest bulk text has waited `max_wait_ns`: then it goes first. So a
    bulk text waits behind interactive ones at most that long (tests/unit/test_clock.py)."""

    __slots__ = ("bulk", "bulk_cost", "interactive", "max_wait_ns")

    def __init__(self, max_wait_ns: int) -> None:
        self.interactive: deque[Request] = deque()
        self.bulk: deque[Request] = deque()
        self.bulk_cost = 0  # of the bulk texts waiting (an interactive text goes before them)
        self.max_wait_ns = max_wait_ns

    def __len__(self) -> int:
        return len(self.interactive) + len(self.bulk)

    def __bool__(self) -> bool:
        return bool(self.interactive) or bool(self.bulk)

    def __iter__(self) -> Iterator[Request]:
        yield from self.interactive
        yield from self.bulk

    def extend(self, reqs: Iterable[Request]) -> None:
        for r in reqs:
            if r.group.priority:
                self.bulk.append(r)
                self.bulk_cost += r.cost
            else:
                self.interactive.append(r)

    def push_front(self, reqs: list[Request]) -> None:
        """Put requests back at the front of their lines, in their order."""
        for r in reversed(reqs):
            if r.group.priority:
                self.bulk.appendleft(r)
                self.bulk_cost += r.cost
            else:
                self.interactive.appendleft(r)

    def take(self, n: int, now_ns: int) -> list[Request]:
        """Up to n requests in the order they should go to workers."""
        out: list[Request] = []
        while len(out) < n and self:
            out.append(self.pop(now_ns))
        return out

    def oldest_ns(self, priority: int) -> int | None:
        """When the oldest text a new one of this priority waits behind was admitted (None:
        none waits). An interactive text goes before the bulk ones; a bulk text waits for
        both lines."""
        heads = [self.interactive[0]] if self.interactive else []
        if priority == BULK and self.bulk:
            heads.append(self.bulk[0])
        return min((r.group.admitted_ns for r in heads), default=None)

    def bulk_due(self, now_ns: int) -> bool:
        """The oldest bulk text has waited its bound: it goes before interactive ones."""
        bulk = self.bulk
        return bool(bulk) and now_ns - bulk[0].group.admitted_ns >= self.max_wait_ns

    def urgent(self, now_ns: int) -> bool:
        """Holds a text that goes before any other's bulk text (service.engine.lanes)."""
        return bool(self.interactive) or self.bulk_due(now_ns)

    def pop(self, now_ns: int) -> Request:
        """The request that should go to a worker next (raises IndexError when empty)."""
        if self.bulk and (not self.interactive or self.bulk_due(now_ns)):
            r = self.bulk.popleft()
            self.bulk_cost -= r.cost
            return r
        return self.interactive.popleft()

    def remove(self, r: Request) -> None:
        """Raises ValueError when it is not waiting."""
        if r.group.priority:
            self.bulk.remove(r)
            self.bulk_cost -= r.cost
        else:
            self.interactive.remove(r)

    def clear(self) -> None:
        self.interactive.clear()
        self.bulk.clear()
        self.bulk_cost = 0
