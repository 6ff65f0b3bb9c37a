"""The framed binary TCP protocol: pipelined `u32 len | text | u64 tag` frames, answers by tag.

Each data_received parses every complete frame in the buffer. Valid frames are admitted to the
dispatcher in groups of up to `binary_group` (one admission and one answer write per group, not
per frame); bad frames are answered at once. While other clients' texts are in flight, a
connection owes at most `binary_max_owed` answers: a frame past that is read and answered
status 2 (overloaded) at once, as is one the queue has no room for, so no frame waits unseen in
the socket. On an idle server a pipelined burst is admitted up to the queue's own ceiling.
Reading pauses only while the transport's write buffer is full: a client that does not read
its answers. A length over `max_frame` ends
the connection once the answers already owed have been written.

A frame with tag 0 and the text `MODEL name[:version]` selects the connection's model for the
frames after it (status 0, or 5 for a model the server does not hold); without one, the only
loaded model serves. Each group of frames resolves its model when it is admitted, so frames for
a model unloaded since answer status 5.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from functools import partial
from typing import Any, Protocol

import numpy as np
from ringserve.service.engine.admission import STATUS_HTTP, Admission, Refusal
from ringserve.service.engine.dispatcher import Result
from ringserve.service.engine.tenants import PRIORITY_NAMES, KeyRing, Tenant
from ringserve.service.model_info import ModelInfo
from ringserve.service.models import ModelRequired, ModelSet, UnknownModel
from ringserve.service.protocols import prompts
from ringserve.service.protocols.auth import AUTH_OK, read_auth_frame
from ringserve.service.protocols.handover import Listeners, listen
from ringserve.service.protocols.texts import checked
from ringserve.service.settings import Config
from ringserve.shm import layout as L
from ringserve.wire.frames import (
    LENGTH,
    TAG,
    encode_answer,
    parse_model_selection,
    status_answer,
)


class BinaryHost(Protocol):
    """What the binary protocol reads of the server (service/front.py's Front)."""

    @property
    def settings(self) -> Config: ...
    @property
    def admission(self) -> Admission: ...
    @property
    def model(self) -> ModelInfo: ...
    @property
    def models(self) -> ModelSet: ...
    @property
    def keys(self) -> KeyRing | None: ...
    @property
    def draining(self) -> bool: ...
    def count(self, protocol: str, code: int, n: int = 1, tenant: Tenant | None = None) -> None: ...


class BinaryPorts(Listeners, Protocol):
    binary_state: BinaryServerState | None  # set here: the drain closes these connections


STATUSES = (
    L.STATUS_OK,
    L.STATUS_BAD_REQUEST,
    L.STATUS_OVERLOADED,
    L.STATUS_DEADLINE,
    L.STATUS_UNKNOWN_MODEL,
)
CODES = {**STATUS_HTTP, L.STATUS_UNKNOWN_MODEL: 404}  # what each status is counted under
EMBED = L.OPTIONS_MARK + bytes([L.OPT_EMBED])  # ask the worker for the text's vector


class BinaryServerState:
    """What every binary connection of one server shares."""

    def __init__(self, server: BinaryHost) -> None:
        self.server = server
        self.settings = server.settings
        self.connections: set[BinaryProtocol] = set()
        self.refused = 0


async def start_binary(
    ports: BinaryPorts, server: BinaryHost, host: str, port: int
) -> asyncio.AbstractServer:
    state = BinaryServerState(server)
    ports.binary_state = state  # the drain closes these connections once answers are out
    return await listen(ports, "binary", lambda: BinaryProtocol(state), host, port, 2048)


class BinaryProtocol(asyncio.Protocol):
    def __init__(self, state: BinaryServerState) -> None:
        self.state = state
        self.server = state.server
        s = state.settings
        self.max_frame: int = s.max_frame
        self.max_owed: int = s.binary_max_owed
        self.group_size: int = s.binary_group
        self.timeout_ns = int(s.request_timeout_s * 1e9)
        self.transport: asyncio.Transport | None = None
        self.buffer = bytearray()
        self.owed = 0  # frames admitted whose answer is not written yet
        self.stopped = False  # an oversize length was read: parse nothing more
        self.eof = False  # the client sent EOF: answer what is buffered, then close
        self.draining = False  # the server drains: answer what is owed, then close
        self.lingering = False  # answers sent and our side shut: dropping input until EOF
        self.linger_s: float = s.binary_linger_s
        self.linger_timer: asyncio.TimerHandle | None = None
        self.paused_reading = False
        self.paused_writing = False
        self.closed = False
        self.last_active = time.monotonic()
        self.partial_since = 0.0  # when an incomplete frame began waiting for its rest
        self.keys = state.server.keys  # None once the AUTH frame passed (or no key set)
        self.tenant: Tenant | None = None  # the key of the AUTH frame, for rate and priority
        self.selected: tuple[str, str | None] | None = None  # the MODEL frame's (name, version)

    # -- connection -----------------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's is no subclass
        state = self.state
        if len(state.connections) >= state.settings.max_connections:
            state.refused += 1
            self.closed = True
            transport.close()
            return
        self.draining = self.server.draining  # accepted late: answer what it sends, then close
        state.connections.add(self)

    def connection_lost(self, exc: Exception | None) -> None:
        self.state.connections.discard(self)
        self.closed = True
        self.buffer.clear()
        if self.linger_timer is not None:
            self.linger_timer.cancel()

    def eof_received(self) -> bool:
        self.eof = True  # a partial frame left at EOF is never answered
        if self.lingering:
            return False  # the client has our answers and is done too: close
        return self.owed > 0  # keep the write side open for the answers still owed

    def pause_writing(self) -> None:
        self.paused_writing = True
        self.update_reading()

    def resume_writing(self) -> None:
        self.paused_writing = False
        self.update_reading()

    def update_reading(self) -> None:
        """Read while the write buffer is under its bound (the client reads its answers)."""
        transport = self.transport
        if transport is None or self.closed:
            return
        if self.eof:
            return  # nothing more will come
        # Once stopped, read and drop what still comes: closing on unread input sends a RST.
        want = self.stopped or self.lingering or not self.paused_writing
        if want and self.paused_reading:
            self.paused_reading = False
            transport.resume_reading()
        elif not want and not self.paused_reading:
            self.paused_reading = True
            transport.pause_reading()

    # -- frames ---------------------------------------------------------------------------------
    def data_received(self, data: bytes) -> None:
        if self.closed or self.stopped or self.lingering:
            return
        self.last_active = now = time.monotonic()
        self.buffer += data
        if self.keys is not None and not self.authenticate():
            return
        self.parse()
        if not self.buffer:
            self.partial_since = 0.0
        elif not self.partial_since:
            self.partial_since = now
        self.update_reading()

    def authenticate(self) -> bool:
        """The first frame must be `AUTH KEY` (service.auth); anything else closes the
        connection with nothing after it read. False while the connection may not go on."""
        assert self.keys is not None
        ok = read_auth_frame(self.buffer, self.keys)
        if ok is None:
            self.partial_since = self.partial_since or self.last_active  # the read timeout
            return False
        if not isinstance(ok, Tenant):
            self.keys.refused("binary")
            self.server.count("binary", 401)  # answered by closing the connection
            self.buffer.clear()
            self.close_now()
            return False
        self.keys = None
        self.tenant = ok
        self.send(AUTH_OK, 200)
        return True

    def sweep(self, now: float) -> None:
        """Close on a frame that arrives slower than the read timeout, or a long idle."""
        if self.closed:
            return
        s = self.state.settings
        if self.paused_reading or self.owed or self.eof:  # the wait is ours: restart its clock
            self.partial_since = now if self.buffer else 0.0
            return
        slow = bool(self.partial_since) and now - self.partial_since > s.read_timeout_s
        idle = not self.owed and not self.buffer and now - self.last_active > s.keepalive_timeout_s
        if slow or idle:
            self.close_now()

    def parse(self) -> None:
        """Admit every complete frame buffered; past the owed bound, answer status 2 at once."""
        buf = self.buffer
        pos, end = 0, len(buf)
        texts: list[bytes] = []
        tags: list[int] = []
        bad: list[bytes] = []
        over: list[int] = []  # frames past the owed bound
        with memoryview(buf) as view:
            while end - pos >= 4:
                (n,) = LENGTH.unpack_from(buf, pos)
                if n > self.max_frame:
                    self.stopped = True
                    break
                stop = pos + 4 + n + 8
                if stop > end:
                    break
                text = view[pos + 4 : pos + 4 + n].tobytes()
                (tag,) = TAG.unpack_from(buf, stop - 8)
                pos = stop
                selection = parse_model_selection(text) if tag == 0 else None
                if selection is not None:
                    if texts:  # the frames before it are for the model selected before
                        self.admit(texts, tags)
                        texts, tags = [], []
                    self.select(selection)
                elif checked(text)[1]:
                    bad.append(status_answer(tag, L.STATUS_BAD_REQUEST))
                elif self.owed + len(tags) >= self.max_owed and self.others_waiting(len(tags)):
                    over.append(tag)
                else:
                    texts.append(text)
                    tags.append(tag)
                    if len(tags) >= self.group_size:
                        self.admit(texts, tags)
                        texts, tags = [], []
        del buf[:pos]
        if texts:
            self.admit(texts, tags)
        if bad:
            self.send(b"".join(bad), 400, len(bad))
        if over:
            self.refuse(over)
        if self.stopped:
            buf.clear()
        self.close_when_done()

    def others_waiting(self, parsed: int) -> bool:
        """Other clients' texts are in flight: the connection's fair share applies (on an
        idle server one connection's pipelined burst takes the queue up to its ceiling)."""
        return self.server.admission.dispatcher.depth > self.owed + parsed

    def select(self, selection: tuple[str, str | None]) -> None:
        """A MODEL frame: the frames after it are for that model, held or not (a model it
        does not hold answers them status 5, as it answers this frame)."""
        self.selected = selection
        found = self.model_of() is not None
        status = L.STATUS_OK if found else L.STATUS_UNKNOWN_MODEL
        self.send(status_answer(0, status), 200 if found else 404)

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
            self.send(answers, CODES[status], len(tags))
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
        embed = m.embed_only  # the contract: an embed model answers n = D floats
        task = "embed" if embed else "classify"

        def on_admit(k: int, level: int) -> Callable[[list[Result]], None]:
            traces = self.start_traces(texts[:k], now, level, task)  # before a worker can start
            self.owed += k
            return partial(self.answer, tags[:k], traces, unit=embed and m.normalize)

        admission = self.server.admission
        prefix = EMBED + prompts.prompt_bytes(m) if embed else b""  # the default prompt
        admitted = admission.submit_each(
            texts, deadline, on_admit, "binary", task, self.tenant, prefix, model=info.index
        )
        if isinstance(admitted, Refusal):  # the model is not open (5), or the deadline (3)
            status = L.STATUS_DEADLINE if admitted.code == 504 else L.STATUS_UNKNOWN_MODEL
            answers = b"".join([status_answer(t, status) for t in tags])
            self.send(answers, admitted.code, len(tags))
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
        if self.tenant is not None:
            attrs["ringserve.tenant"] = self.tenant.name
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
        self.send(answers, 429, len(tags))

    def refuse(self, tags: list[int]) -> None:
        """Frames past the connection's bound of answers owed: refused, as the queue's are."""
        self.server.admission.refuse(len(tags))
        self.overloaded(tags)

    def overloaded(self, tags: list[int]) -> None:
        answers = b"".join([status_answer(t, L.STATUS_OVERLOADED) for t in tags])
        self.send(answers, 503, len(tags))

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
        self.owed -= len(tags)
        if traces is not None:
            self.end_traces(traces, results)
        if self.send(b"".join(out), 200, len(tags) - len(failed)):
            for code in failed:
                self.server.count("binary", code, 1, self.tenant)
        self.close_when_done()
        self.update_reading()

    def end_traces(self, traces: list[Any], results: list[Result]) -> None:
        now = time.monotonic_ns()
        for trace, r in zip(traces, results, strict=True):
            if trace is not None:
                trace.answered([r], now)
        written = time.monotonic_ns()  # the group's answers go out in one write, just after
        for trace, r in zip(traces, results, strict=True):
            if trace is not None:
                trace.written(STATUS_HTTP.get(r.status, 500), written)

    def send(self, answers: bytes, code: int, n: int = 1) -> bool:
        """Write answers and count `n` of them under `code`: the one place binary answers
        leave. An answer that cannot be written (the connection is gone) is not counted."""
        if self.closed or self.transport is None:
            return False
        self.transport.write(answers)
        if n:
            self.server.count("binary", code, n, self.tenant)
        return True

    def close_when_done(self) -> None:
        """After an oversize length, EOF or the drain: close once every owed answer is written."""
        transport = self.transport
        if not (self.stopped or self.eof or self.draining) or self.owed or self.closed:
            return
        if self.lingering:
            return
        if transport is None:
            return
        if self.eof or not transport.can_write_eof():
            self.closed = True
            transport.close()  # close() still sends what the write buffer holds
            return
        # A lingering close: a RST (closing with the client's bytes unread) could erase answers
        # the client has not read yet, so send FIN after them and drop input until its EOF.
        self.lingering = True
        transport.write_eof()
        self.update_reading()
        loop = asyncio.get_running_loop()
        self.linger_timer = loop.call_later(self.linger_s, self.close_now)

    def begin_drain(self) -> None:
        """The server drains: an idle connection closes at once (as uvicorn and Go's Shutdown
        close theirs); one with answers owed closes after the last of them."""
        self.draining = True
        if not self.owed:
            self.close_now()
        else:
            self.close_when_done()

    def owes(self) -> bool:
        """Answers are still to be written on it (a lingering close owes nothing)."""
        return not self.closed and self.owed > 0

    def close_now(self) -> None:
        if not self.closed and self.transport is not None:
            self.closed = True
            self.transport.close()


def unit_vector(vec: np.ndarray) -> np.ndarray:
    """`vec` L2-normalized, computed in float64 as the HTTP routes do (protocols/tasks.py)."""
    v = np.asarray(vec, dtype=np.float64)
    out: np.ndarray = (v / max(float(np.linalg.norm(v)), 1e-12)).astype(np.float32)
    return out
