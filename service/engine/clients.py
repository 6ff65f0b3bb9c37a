"""One client connection as the engine sees it (`Client`): how many of its texts are admitted
and unanswered, for its share of the queue, and what is dropped once it has gone.

A client is a connection (HTTP or binary): the unit whose answers have one reader. While other
clients' texts are in flight, one client may hold at most its share of --max-queue
(--client-queue-share); alone it may fill the queue, so a burst on an idle server is never cut.
When another client then finds the queue full, the one holding the most past its share gives
up its newest requests that no worker has started (`make_room`: answered 503, binary status
2), so a burst holds the queue only until someone else needs it.

When its connection is lost, its texts still waiting in the front-end are dropped before any
worker sees them (`drop`): nobody would read their answers. Texts already in a worker's ring
are run (a ring record cannot be taken back) and their answers discarded. A client that shut
its sending side (EOF) may be gone or may be reading on: until its protocol knows, its waiting
texts wait as bulk texts do (`behind`), after every interactive text, so that nobody waits on
work nobody may read.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Protocol

from ringserve.service.engine.answers import Answers
from ringserve.service.engine.lanes import Lane, Lines
from ringserve.service.engine.requests import BULK, Group, Request, Result
from ringserve.shm import layout as L


class Client:
    __slots__ = ("gone", "texts")

    def __init__(self) -> None:
        self.texts = 0  # admitted and not yet answered (a group counts until its last answer)
        self.gone = False  # its connection was lost: nothing of it is admitted any more

    def answered(self, n: int) -> None:
        self.texts -= n


def share_of(max_queue: int, share: float) -> int:
    """The texts one client may hold while others' are in flight (0: no share); at least 1."""
    return max(1, math.floor(max_queue * share)) if share > 0 else 0


class Owed(Protocol):
    """What the dispatcher holds, as these read it (service.engine.dispatcher.Dispatcher)."""

    inflight: dict[int, Request]
    waiting: Lines
    answers: Answers

    @property
    def lanes(self) -> Mapping[int, Lane]: ...
    def refill(self) -> None: ...
    def refuse(self, n: int, model: int = 0) -> None: ...


def split(lines: Lines, client: Client) -> tuple[list[Request], list[Request]]:
    """The waiting texts of everyone else and of `client`, each in its order."""
    others: list[Request] = []
    mine: list[Request] = []
    for r in lines:
        (mine if r.group.client is client else others).append(r)
    return others, mine


def behind(owed: Owed, client: Client) -> int:
    """The client's waiting texts wait as bulk texts from now on: after every interactive text,
    or once they have waited --bulk-max-wait-ms. Returns how many."""
    others, mine = split(owed.waiting, client)
    for r in mine:
        r.group.priority = BULK  # its texts still waiting go to the bulk lines below
    if mine:
        owed.waiting.clear()
        owed.waiting.extend(others + mine)
    return len(mine)


def drop(owed: Owed, client: Client) -> int:
    """Forget every text of `client` still waiting for a worker (in no ring yet): out of the
    waiting lines and the queue's count, never answered. Returns how many. One pass over the
    waiting lines, however many of them are the client's."""
    client.gone = True
    others, mine = split(owed.waiting, client)
    if not mine:
        return 0
    owed.waiting.clear()
    owed.waiting.extend(others)  # the same order: each model's line keeps its own
    for r in mine:
        if owed.inflight.pop(r.id, None) is not None:
            owed.lanes[r.group.model].answered(r.cost)  # its group is never completed:
            # its other texts, answered from rings, leave `remaining` above 0 (no callback)
    client.texts -= len(mine)
    owed.refill()
    return len(mine)


def make_room(owed: Owed, client: Client | None, n: int, share: int) -> int:
    """`n` texts of `client` (within its share) find the queue full: the client holding the most
    past its share gives up its newest waiting groups that no worker has started, each answered
    as refused (STATUS_OVERLOADED: HTTP 503, binary status 2), until n fit or it is down to its
    share. Returns the texts given up."""
    if not share or (client is not None and client.texts + n > share):
        return 0
    holders = {r.group.client for r in owed.waiting}
    holders.discard(None)
    holders.discard(client)
    hog: Client | None = max(holders, key=lambda c: c.texts, default=None)
    if hog is None or hog.texts <= share:
        return 0
    firsts: dict[int, tuple[int, Group]] = {}  # its groups no worker started: (first id, group)
    for r in owed.waiting:
        g = r.group
        if g.client is hog and not g.started and (id(g) not in firsts or r.id < firsts[id(g)][0]):
            firsts[id(g)] = (r.id, g)
    shed: set[int] = set()  # id() of the groups given up
    freed = 0
    for _, group in sorted(firsts.values(), key=lambda f: f[0], reverse=True):  # newest first
        if freed >= n or hog.texts - freed <= share:
            break
        shed.add(id(group))
        freed += group.remaining
    if not shed:
        return 0
    kept = [r for r in owed.waiting if id(r.group) not in shed]
    out = [r for r in owed.waiting if id(r.group) in shed]
    owed.waiting.clear()
    owed.waiting.extend(kept)
    for r in out:
        owed.refuse(1, r.group.model)
        owed.answers.complete(r, Result(L.STATUS_OVERLOADED))
    return len(out)
