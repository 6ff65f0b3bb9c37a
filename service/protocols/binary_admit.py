"""What a binary connection's frames become: the model each is for (the MODEL frame's choice),
one admission a group, the refusals (status 2 over the queue or the connection's share, 6 over
the key's rate, 5 for a model not held, 3 past the deadline), the answers by tag, and a span
for each frame when tracing is on. The framing and the connection are binary.py's."""

from __future__ import annotations

import time
from collections.abc import Callable
from functools import partial
from typing import Any, Protocol

import numpy as np
from ringserve.service.engine.admission import STATUS_HTTP, Refusal
from ringserve.service.engine.clients import Client
from ringserve.service.engine.requests import Ask, Result
from ringserve.service.engine.tenants import PRIORITY_NAMES, Tenant
from ringserve.service.models.info import ModelInfo
from ringserve.service.models.modelset import ModelRequired, UnknownModel
from ringserve.service.protocols.auth import AUTH_OK, read_auth_frame
from ringserve.service.protocols.peers import KeyFailures
from ringserve.service.request import prompts
from ringserve.service.views import FrontView
from ringserve.shm import layout as L
from ringserve.wire.frames import encode_answer, status_answer

STATUSES = (
    L.STATUS_OK,
    L.STATUS_BAD_REQUEST,
    L.STATUS_OVERLOADED,
    L.STATUS_DEADLINE,
    L.STATUS_UNKNOWN_MODEL,
)
CODES = {**STATUS_HTTP, L.STATUS_UNKNOWN_MODEL: 404}  # what each status is counted under


class Answers(Protocol):
    """What the admitter needs of its connection (binary.BinaryProtocol)."""

    owed: int  # frames admitted whose answer is not written yet
    tenant: Tenant | None
    peer: str  # the client's address (peers.peer_of)
    client: Client  # its texts in the queue (engine.clients)

    def send(self, answers: bytes, code: int, n: int = 1) -> bool: ...
    def close_when_done(self) -> None: ...
    def close_now(self) -> None: ...


class FrameAdmitter:
    """One connection's frames, admitted and answered."""

    def __init__(
        self,
        conn: Answers,
        server: FrontView,
        timeout_s: float,
        failures: KeyFailures | None = None,
    ) -> None:
        self.conn = conn
        self.server = server
        self.failures = failures  # failed AUTH frames by client address (--auth-failures)
        self.timeout_ns = int(timeout_s * 1e9)
        self.selected: tuple[str, str | None] | None = None  # the MODEL frame's (name, version)
        self.keys = server.keys  # None once the AUTH frame passed (or no key set)

    def authenticate(self, buffer: bytearray) -> bool:
        """The first frame must be `AUTH KEY` (service.auth); anything else closes the
        connection with nothing after it read. False while the connection may not go on. An
        address past its failed attempts (--auth-failures) is closed unchecked."""
        assert self.keys is not None
        failures, peer = self.failures, self.conn.peer
        if failures is not None and failures.wait_s(peer):
            self.server.count("binary", 429)  # answered by closing the connection
            buffer.clear()
            self.conn.close_now()
            return False
        ok = read_auth_frame(buffer, self.keys)
        if ok is None:
            return False
        if not isinstance(ok, Tenant):
            self.keys.refused("binary")
            if failures is not None:
                failures.failed(peer)
            self.server.count("binary", 401)  # answered by closing the connection
            buffer.clear()
            self.conn.close_now()
            return False
        self.keys = None
        self.conn.tenant = ok
        self.conn.send(AUTH_OK, 200)
        return True

    def others_waiting(self, parsed: int) -> bool:
        """Other clients' texts are in flight: the connection's fair share applies (on an
        idle server one connection's pipelined burst takes the queue up to its ceiling)."""
        return self.server.admission.dispatcher.depth > self.conn.owed + parsed

    def select(self, selection: tuple[str, str | None]) -> None:
        """A MODEL frame: the frames after it are for that model, held or not (a model it
        does not hold answers them status 5, as it answers this frame)."""
        self.selected = selection
        found = self.model_of() is not None
        status = L.STATUS_OK if found else L.STATUS_UNKNOWN_MODEL
        self.conn.send(status_answer(0, status), 200 if found else 404)

    def model_of(self, tags: list[int] | None = None) -> ModelInfo | None:
        """The connection's model now; None (after answering `tags` status 5, or 1 when
        several models are loaded and none was selected) when none serves."""
        name, version = self.selected or (None, None)
        try:
            if name == "":
                raise UnknownModel("a MODEL frame names no model")
            return self.server.models.find(name, version)
        except UnknownModel:
            status = L.STATUS_UNKNOWN_MODEL
        except ModelRequired:
            status = L.STATUS_BAD_REQUEST
        if tags:
            answers = b"".join([status_answer(t, status) for t in tags])
            self.conn.send(answers, CODES[status], len(tags))
        return None

    def admit(self, texts: list[bytes], tags: list[int]) -> None:
        """One admission for the frames that fit; the rest answer status 2 (or 6, over the
        key's rate). Each frame is a request of its own, so the group is admitted in part
        rather than refused whole."""
        now = time.monotonic_ns()
        deadline = now + self.timeout_ns  # from the frame's arrival
        info = self.model_of(tags)
        if info is None:
            return
        m = info.manifest
        if m.token_classifies or "sparse" in m.task:
            # per-token answers and a sparse model's terms have no frame: status 1, as a bad
            # text (docs/api.md)
            bad = L.STATUS_BAD_REQUEST
            self.conn.send(b"".join([status_answer(t, bad) for t in tags]), CODES[bad], len(tags))
            return
        embed = m.embed_only  # the contract: an embed model answers n = D floats
        task = "embed" if embed else "classify"

        def on_admit(k: int, level: int) -> Callable[[list[Result]], None]:
            traces = self.start_traces(texts[:k], now, level, task)  # before a worker can start
            self.conn.owed += k
            return partial(self.answer, tags[:k], traces, unit=embed and m.normalize)

        prefix = prompts.prompt_bytes(m) if embed else b""  # the default prompt
        payloads = [prefix + t for t in texts] if prefix else texts
        options = L.OPT_EMBED if embed else 0  # ask the worker for the text's vector
        ask = Ask(payloads, options, task, info.index, deadline, None, "binary")
        admission = self.server.admission
        admitted = admission.submit_each(ask, on_admit, self.conn.tenant, self.conn.client)
        if isinstance(admitted, Refusal):  # the model is not open (5), or the deadline (3)
            status = L.STATUS_DEADLINE if admitted.code == 504 else L.STATUS_UNKNOWN_MODEL
            answers = b"".join([status_answer(t, status) for t in tags])
            self.conn.send(answers, admitted.code, len(tags))
            return
        k, within = admitted
        if within < len(tags):
            self.limit(tags[within:])
        if k < within:
            self.overloaded(tags[k:within])  # the admission counted them

    def start_traces(self, texts: list[bytes], now: int, level: int, task: str) -> list[Any] | None:
        """A span for each frame when tracing is on (a binary frame carries no traceparent)."""
        tracing = self.server.admission.tracing
        if tracing is None:
            return None
        attrs: dict[str, Any] = {"ringserve.task": task}
        attrs["ringserve.priority"] = PRIORITY_NAMES[level]
        if self.conn.tenant is not None:
            attrs["ringserve.tenant"] = self.conn.tenant.name
        admitted = time.monotonic_ns()
        traces = []
        for text in texts:
            trace = tracing.start("binary frame", "binary", now, attributes=attrs)
            if trace is not None:
                trace.admitted(admitted, 1, len(text))
            traces.append(trace)
        return traces

    def limit(self, tags: list[int]) -> None:
        """Frames over the key's rate (counted by the admission): status 6, answered as 429."""
        answers = b"".join([status_answer(t, L.STATUS_RATE_LIMITED) for t in tags])
        self.conn.send(answers, 429, len(tags))

    def refuse(self, tags: list[int]) -> None:
        """Frames past the connection's bound of answers owed: refused, as the queue's are."""
        self.server.admission.refuse(len(tags))
        self.overloaded(tags)

    def overloaded(self, tags: list[int]) -> None:
        answers = b"".join([status_answer(t, L.STATUS_OVERLOADED) for t in tags])
        self.conn.send(answers, 503, len(tags))

    # -- answers --------------------------------------------------------------------------------
    def answer(
        self, tags: list[int], traces: list[Any] | None, results: list[Result], unit: bool = False
    ) -> None:
        """Write a group's answers; `unit`: embeddings, L2-normalized as the model's own
        pipeline does (manifest `normalize`)."""
        out: list[bytes] = []
        failed: list[int] = []  # the codes of the answers that are not ok
        for tag, r in zip(tags, results, strict=True):
            if r.status == L.STATUS_OK and r.scores is not None:
                scores = unit_vector(r.scores) if unit else r.scores
                out.append(encode_answer(tag, L.STATUS_OK, r.label_id, scores.tobytes(), r.flags))
            else:
                status = r.status if r.status in STATUSES else L.STATUS_INTERNAL
                if r.status == L.STATUS_TOO_LONG:  # the contract's "bad request" (status 1)
                    status = L.STATUS_BAD_REQUEST
                out.append(status_answer(tag, status))
                failed.append(CODES.get(status, 500))
        self.conn.owed -= len(tags)
        if traces is not None:
            self.end_traces(traces, results)
        if self.conn.send(b"".join(out), 200, len(tags) - len(failed)):
            for code in failed:
                self.server.count("binary", code, 1, self.conn.tenant)
        self.conn.close_when_done()

    def end_traces(self, traces: list[Any], results: list[Result]) -> None:
        now = time.monotonic_ns()
        for trace, r in zip(traces, results, strict=True):
            if trace is not None:
                trace.answered([r], now)
        written = time.monotonic_ns()  # the group's answers go out in one write, just after
        for trace, r in zip(traces, results, strict=True):
            if trace is not None:
                trace.written(STATUS_HTTP.get(r.status, 500), written)


def unit_vector(vec: np.ndarray) -> np.ndarray:
    """`vec` L2-normalized, computed in float64 as the HTTP routes do (protocols/tasks.py)."""
    v = np.asarray(vec, dtype=np.float64)
    out: np.ndarray = (v / max(float(np.linalg.norm(v)), 1e-12)).astype(np.float32)
    return out
