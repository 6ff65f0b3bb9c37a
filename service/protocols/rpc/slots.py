"""Call requests kept outstanding in gRPC core (rpc/server.py, docs/design.md "gRPC"): grpcio's
threaded server asks core for one call at a time, and a call core takes while no request is
outstanding for it waits unmatched, where a stop cancels it (grpc/grpc#41785). `request_slots`
keeps many outstanding. It reaches into grpcio's private server state, which it checks first;
where it does not fit, it changes nothing. This module imports no protobuf messages, so a test can
load it beside tritonclient's (both name the package `inference`)."""

from __future__ import annotations

import collections

import grpc
import grpc._server as grpc_server


class Owed(set[object]):
    """grpcio's `_ServerState.due` (the completions a server still waits for, as a set of tags)
    made a multiset, so that one tag may be owed many times: one for each outstanding request.
    Membership and truth are the set's: a tag stays in it while its count is above zero."""

    def __init__(self, tags: set[object]) -> None:
        super().__init__(tags)
        self.counts: collections.Counter[object] = collections.Counter(tags)

    def add(self, tag: object) -> None:
        self.counts[tag] += 1
        super().add(tag)

    def remove(self, tag: object) -> None:
        if self.counts[tag] <= 0:
            raise KeyError(tag)
        self.counts[tag] -= 1
        if not self.counts[tag]:
            del self.counts[tag]
            super().remove(tag)

    def discard(self, tag: object) -> None:
        if self.counts[tag] > 0:
            self.remove(tag)


def request_slots(server: grpc.Server, calls: int, registered: int = 8) -> bool:
    """Keep `calls` requests for a call outstanding in gRPC core (and `registered` for each
    registered method: health's), where grpcio keeps one, so that no call waits in core
    unmatched, where a stop cancels it. Call it right after `server.start()`; each matched call
    is followed by a new request, as grpcio does for its one. False (nothing changed) where this
    grpcio's server is not the one this was written against (grpcio 1.81 to 1.85)."""
    state = getattr(server, "_state", None)
    request = getattr(grpc_server, "_request_call", None)
    request_registered = getattr(grpc_server, "_request_registered_call", None)
    stage = getattr(grpc_server, "_ServerStage", None)
    due = getattr(state, "due", None)
    if state is None or request is None or request_registered is None or stage is None:
        return False
    if type(due) not in (set, Owed) or state.stage is not stage.STARTED:
        return False
    with state.lock:
        if not isinstance(state.due, Owed):
            state.due = Owed(state.due)
        for _ in range(calls - 1):
            request(state)
        for method in state.registered_method_handlers:
            for _ in range(registered - 1):
                request_registered(state, method)
    return True
