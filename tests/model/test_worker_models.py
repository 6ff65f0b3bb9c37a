"""One worker serving two models, run in this process over a real channel (no server): each
request reaches the model its index names and is answered exactly as that model's own
one-model worker answers it; an index the worker does not hold is answered status 5; each
model's memory is in the control block."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from ringserve.shm import layout as L
from ringserve.shm.channel import Channel, Doorbells
from ringserve.shm.control import model_rss
from ringserve.workers.artifact import ArtifactError
from ringserve.workers.process.answers import Running
from ringserve.workers.process.worker import Worker
from ringserve.workers.process.zygote import Zygote
from ringserve.workers.spec import STOP_SIGNAL, ModelRef, WorkerSpec

from devkit.exports import HfExports

TEXTS = [
    "a gripping, beautiful film",
    "a dull, lifeless mess",
    "ok",
    "the plot twists are clever but the acting " * 12,  # cut at either model's max length
]
PAIRS = [("a man sleeps", "a person rests"), ("it rains", "the sun shines")]
SERIAL = iter(range(970_000, 980_000))
DEADLINE_S = 120.0  # a forked worker's boot: seconds, on a loaded machine
NLI = 2  # the tiny model's index: any index but 0 is marked on the wire


@pytest.fixture(scope="module")
def nli(hf_exports: HfExports) -> str:
    """A tiny random 3-label BERT (devkit/hfmodels.py), exported as `ringserve export` does
    (once a session, with cheap_builds: the worker is tested here, not int8's choice or its
    cost; devkit/exports.py)."""
    return str(hf_exports.artifact("bert"))


def new_wire() -> tuple[int, Channel, Doorbells]:
    """A worker's serial, channel and doorbells, as the front-end makes them."""
    serial = next(SERIAL)
    return serial, Channel.create(os.getpid(), serial, 64, 256), Doorbells()


def worker_spec(
    wire: tuple[int, Channel, Doorbells], model_dir: str, models: tuple[ModelRef, ...], runtime: str
) -> WorkerSpec:
    """What the front-end would tell a CPU worker of these models, with this process its parent."""
    serial, channel, bells = wire
    return WorkerSpec(
        serial=serial, parent_pid=os.getpid(), cpus=[0],
        threads=1, device="cpu", model_dir=model_dir, channel=channel.names, buckets=(),
        max_batch=8, max_delay_ms=0.0, doorbell=bells.request, eventfd=bells.answer,
        runtime=runtime, models=models,
    )  # fmt: skip


def payloads(
    requests: list[tuple[int, str | tuple[str, str]]],
) -> list[tuple[int, bytes, int, int]]:
    """Ring messages (msg id = position) for (model index, text or pair) requests: the model in
    the record's meta word (shm/layout.py request_meta)."""
    msgs = []
    for msg_id, (index, text) in enumerate(requests):
        parts = (text,) if isinstance(text, str) else text
        body = L.PAIR_SEPARATOR.join(t.encode() for t in parts)
        msgs.append((msg_id, body, 0, L.request_meta(0, index)))
    return msgs


def answers(messages: list[tuple[int, int, int, bytes]]) -> dict[int, tuple[int, int, bytes]]:
    """Each msg id's (status, label, float32 scores as bytes)."""
    out = {}
    for msg_id, _, _, payload in messages:
        status, _, label, n, *_ = L.RESPONSE.unpack_from(payload)
        scores = np.frombuffer(payload[L.RESPONSE_SIZE :], dtype=np.float32)
        out[msg_id] = (status, label, scores[:n].tobytes())
    return out


class InProcess:
    """A Worker booted in this process on a channel of its own; ask() plays the front-end."""

    def __init__(self, model_dir: str, models: tuple[ModelRef, ...], runtime: str) -> None:
        wire = new_wire()
        _, self.channel, self.bells = wire
        spec = worker_spec(wire, model_dir, models, runtime)
        self.worker = Worker(spec)

    @classmethod
    def booted(cls, model_dir: str, models: tuple[ModelRef, ...], runtime: str) -> InProcess:
        made = cls(model_dir, models, runtime)
        try:
            made.worker.boot()
        except BaseException:
            made.close()
            raise
        return made

    def ask(self, requests: list[tuple[int, str | tuple[str, str]]]) -> dict[int, Any]:
        """Send (model index, text or pair) requests at once; each msg id's answer."""
        msgs = payloads(requests)
        assert self.channel.requests.write_many(msgs) == len(msgs)
        w = self.worker
        assert w.intake.take_requests() == len(msgs)
        while True:
            # max_delay 0: whatever waits is due; a batch behind holds back its model's next
            index, wait = w.models.turns.next(0, w.behind.busy)
            if index is None:
                if w.behind.busy:
                    w.answer(*w.behind.finish())
                    continue
                assert wait == -1
                break
            served = w.models.served[index]
            w.run(0, Running(served, *served.batcher.take()))
        got = answers(self.channel.responses.read())
        assert sorted(got) == list(range(len(msgs)))
        return got

    def close(self) -> None:
        self.worker.close()
        self.channel.close()
        self.channel.unlink()
        self.bells.close()


@pytest.fixture(params=["torch", "onnx"])
def runtime(request: pytest.FixtureRequest) -> str:
    return str(request.param)


class Booted(dict[str, InProcess]):
    """The workers a test asks for, each booted on its first use (a test of two of the three
    boots two: a boot is up to a second on a busy machine)."""

    def __init__(self, specs: dict[str, tuple[str, tuple[ModelRef, ...]]], runtime: str) -> None:
        super().__init__()
        self.specs, self.runtime = specs, runtime

    def __missing__(self, name: str) -> InProcess:
        model_dir, models = self.specs[name]
        self[name] = InProcess.booted(model_dir, models, self.runtime)
        return self[name]


@pytest.fixture
def workers(default_model: str, nli: str, runtime: str) -> Iterator[dict[str, InProcess]]:
    """The two-model worker, and each model's own one-model worker (the old spec: no models)."""
    both = (ModelRef(0, "sst2", 1, default_model), ModelRef(NLI, "nli", 1, nli))
    specs = {"both": (default_model, both), "sst2": (default_model, ()), "nli": (nli, ())}
    made = Booted(specs, runtime)
    try:
        yield made
    finally:
        for w in made.values():
            w.close()


def mixed() -> list[tuple[int, str | tuple[str, str]]]:
    """Both models' texts interleaved, so a batch of the wrong model's texts would show."""
    out: list[tuple[int, str | tuple[str, str]]] = []
    for text in TEXTS:
        out += [(0, text), (NLI, text)]
    out += [(NLI, pair) for pair in PAIRS]
    return out


def test_each_model_answers_exactly_as_its_own_worker(workers: dict[str, InProcess]) -> None:
    requests = mixed()
    got = workers["both"].ask(requests)
    alone = {
        index: workers[name].ask([(0, text) for i, text in requests if i == index])
        for index, name in ((0, "sst2"), (NLI, "nli"))
    }
    seen = {0: 0, NLI: 0}
    for msg_id, (index, _) in enumerate(requests):
        want = alone[index][seen[index]]
        seen[index] += 1
        assert got[msg_id] == want  # status, label and the float32 scores, byte for byte
        n = len(want[2]) // 4
        assert want[0] == L.STATUS_OK and n == (2 if index == 0 else 3)
    sst2_rows = {got[i][2] for i, (index, _) in enumerate(requests) if index == 0}
    assert len(sst2_rows) == len(TEXTS)  # different texts, different scores: not a constant


def test_a_busy_model_s_batches_run_behind_a_light_one_s_with_the_same_answers(
    workers: dict[str, InProcess],
) -> None:
    """Twelve texts of one model to one of the other: the busier one is owed to the lighter
    (Turns), so its batches run on the background thread, whole, while the lighter one's run
    on the loop; every answer is still the one-model worker's, byte for byte."""
    w = workers["both"]
    requests: list[tuple[int, str | tuple[str, str]]] = [(0, t) for t in TEXTS * 3]
    requests.insert(5, (NLI, TEXTS[0]))
    before = w.worker.behind.runs
    got = w.ask(requests)
    assert w.worker.behind.runs > before
    assert w.worker.models.turns.owes(0) and not w.worker.models.turns.owes(NLI)
    assert all(b.cap_tokens == 0 for b in w.worker.models.turns.batchers.values())  # whole batches
    alone = workers["sst2"].ask([(0, t) for i, t in requests if i == 0])
    mine = [got[k] for k, (i, _) in enumerate(requests) if i == 0]
    assert mine == [alone[k] for k in range(len(alone))]
    assert got[5] == workers["nli"].ask([(0, TEXTS[0])])[0]


def test_an_index_the_worker_does_not_hold_is_status_5(workers: dict[str, InProcess]) -> None:
    w = workers["both"]
    got = w.ask([(1, "hello"), (0, "hello"), (L.MAX_MODELS + 3, "hello"), (NLI, "hello")])
    assert [got[i][0] for i in range(4)] == [
        L.STATUS_UNKNOWN_MODEL, L.STATUS_OK, L.STATUS_UNKNOWN_MODEL, L.STATUS_OK,
    ]  # fmt: skip
    assert w.worker.ctl.get("unknown_model") == 2
    assert w.worker.ctl.get("bad_requests") == 0
    one = workers["nli"].ask([(NLI, "hello")])  # a one-model worker holds index 0 alone
    assert one[0][0] == L.STATUS_UNKNOWN_MODEL


def test_each_model_s_memory_is_in_the_control_block(workers: dict[str, InProcess]) -> None:
    ctl = workers["both"].worker.ctl
    sst2, tiny = model_rss(ctl, 0), model_rss(ctl, NLI)
    assert sst2 > 4 << 20  # MiniLM: tens of MiB of weights and buffers
    assert 0 < tiny < sst2  # two layers of 32 wide
    assert [model_rss(ctl, i) for i in range(L.MAX_MODELS) if i not in (0, NLI)] == [0] * 62
    assert model_rss(workers["sst2"].worker.ctl, 0) > 4 << 20
    assert ctl.get("state") == L.W_READY


def test_a_bad_second_model_names_itself_and_is_the_model_s_fault(
    default_model: str, tmp_path: Path
) -> None:
    refs = (ModelRef(0, "sst2", 1, default_model), ModelRef(1, "gone", 1, str(tmp_path)))
    made = InProcess(default_model, refs, "torch")
    try:
        with pytest.raises(ArtifactError):
            made.worker.boot()
        assert made.worker.models.loader.current == refs[1]
        assert not made.worker.models.model_ok  # main() exits EXIT_BOOT_ERROR, not a device's
        assert made.worker.ctl.get("state") == L.W_STARTING
    finally:
        made.close()


def wait_for(check: Any, what: str) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while not check():
        assert time.monotonic() < deadline, f"no {what} within {DEADLINE_S} s"
        time.sleep(0.01)


def test_a_worker_forked_from_a_two_model_zygote_answers_both(default_model: str, nli: str) -> None:
    """The zygote preloads both TorchScript models; the worker it forks serves both, as the
    in-process worker does, and finds both models' memory measured."""
    refs = (ModelRef(0, "sst2", 1, default_model), ModelRef(NLI, "nli", 1, nli))
    requests = mixed()
    here = InProcess.booted(default_model, refs, "torch")
    try:
        want = here.ask(requests)
    finally:
        here.close()
    zygote = Zygote(refs, 1, True)
    wire = new_wire()
    _, chan, bells = wire
    pid = None
    try:
        wait_for(zygote.poll, "ready zygote")
        pid = zygote.fork(worker_spec(wire, default_model, refs, "torch"))
        assert pid is not None
        wait_for(lambda: chan.ctl.get("state") == L.W_READY, "ready worker")
        assert model_rss(chan.ctl, 0) > 4 << 20 and model_rss(chan.ctl, NLI) > 0
        msgs = payloads(requests)
        assert chan.requests.write_many(msgs) == len(msgs)
        bells.request.release(len(msgs))
        got: dict[int, Any] = {}

        def all_answered() -> bool:
            got.update(answers(chan.responses.read()))
            return len(got) == len(msgs)

        wait_for(all_answered, "answers")
        for msg_id, (status, label, scores) in want.items():
            assert got[msg_id][:2] == (status, label)
            a, b = np.frombuffer(scores, np.float32), np.frombuffer(got[msg_id][2], np.float32)
            np.testing.assert_allclose(a, b, rtol=0, atol=1e-6)
    finally:
        stop_and_close(pid, zygote, chan, bells)


def stop_and_close(pid: int | None, zygote: Any, chan: Any, bells: Any) -> None:
    """Stop a forked worker (it must exit 0), then close the zygote and the worker's channel."""
    if pid is not None:
        os.kill(pid, STOP_SIGNAL)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
    zygote.close()
    chan.close()
    chan.unlink()
    bells.close()


def threads_on(pid: int) -> dict[int, tuple[set[int], int]]:
    """Each thread of a process: the CPUs it may run on, and the CPU ticks it has used."""
    out = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        base = f"/proc/{pid}/task/{tid}"
        with open(f"{base}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        out[int(tid)] = (os.sched_getaffinity(int(tid)), int(fields[11]) + int(fields[12]))
    return out


@pytest.mark.parametrize("precision", ["fp32", "int8-checked"])
def test_the_lanes_of_a_worker_share_one_session_each_with_its_own_buffers(
    default_model: str, precision: str
) -> None:
    """Two lanes on ONNX Runtime hold the weights once: one session (int8-checked: both of its
    sessions), which each lane runs on its own thread, from input buffers of its own (a lone
    text that went to either lane found the other session's copy in the cache: docs/design.md,
    "A lone request")."""
    made = InProcess(default_model, (), "onnx")
    made.worker.spec.lanes = 2
    made.worker.spec.precision = precision
    made.worker.lanes.count = 2
    try:
        made.worker.boot()
        first, second = made.worker.models.served[0].runners
        assert first.session is second.session  # type: ignore[attr-defined]
        assert getattr(first, "fp32", None) is getattr(second, "fp32", None)
        assert first.ids is not second.ids  # type: ignore[attr-defined]
        if precision == "int8-checked":
            assert first.fp32 is not None  # type: ignore[attr-defined]
    finally:
        made.close()


def test_a_worker_of_two_lanes_answers_as_one_lane_does_each_lane_on_its_core(
    default_model: str, sst2_texts: list[str]
) -> None:
    """A worker of 2 lanes (forked from the zygote, as a server's is) answers 600 texts sent
    at once with the labels and scores (within the 1e-5 of fp32) a one-lane worker gives;
    each lane thread is pinned to a core of its own and used CPU, and the stop signal ends it
    with exit 0."""
    cpus = sorted(os.sched_getaffinity(0))[:2]
    if len(cpus) < 2:
        pytest.skip("two lanes need two CPUs")
    requests: list[tuple[int, str | tuple[str, str]]] = [(0, t) for t in sst2_texts[:600]]
    here = InProcess.booted(default_model, (), "onnx")
    want: dict[int, Any] = {}
    try:
        for start in range(0, len(requests), 16):  # as its 64-slot ring takes them
            some = here.ask(requests[start : start + 16])
            want.update({start + k: answer for k, answer in some.items()})
    finally:
        here.close()
    zygote = Zygote((ModelRef(0, "", 0, default_model),), 1, False)
    wire = new_wire()
    _, chan, bells = wire
    spec = worker_spec(wire, default_model, (), "onnx")
    spec.cpus, spec.lanes, spec.max_delay_ms = cpus, 2, 2.0
    pid = None
    try:
        wait_for(zygote.poll, "ready zygote")
        pid = zygote.fork(spec)
        assert pid is not None
        wait_for(lambda: chan.ctl.get("state") == L.W_READY, "ready worker")
        got: dict[int, Any] = {}
        msgs = payloads(requests)

        def all_answered() -> bool:
            got.update(answers(chan.responses.read()))
            return len(got) == len(msgs)

        sent = 0
        while sent < len(msgs):  # as the ring takes them
            n = chan.requests.write_many(msgs[sent:])
            if n:
                bells.request.release(n)
            sent += n
            all_answered()
        wait_for(all_answered, "answers")
        assert sorted(got) == sorted(want)
        for msg_id, (status, label, scores) in want.items():
            assert got[msg_id][:2] == (status, label) and status == L.STATUS_OK
            a, b = np.frombuffer(scores, np.float32), np.frombuffer(got[msg_id][2], np.float32)
            np.testing.assert_allclose(a, b, rtol=0, atol=1e-5)
        assert chan.ctl.get("requests") == len(msgs)
        pinned = {next(iter(c)): ticks for c, ticks in threads_on(pid).values() if len(c) == 1}
        assert set(pinned) == set(cpus), threads_on(pid)  # lane 0 on one core, lane 1 on the other
        assert all(ticks >= 5 for ticks in pinned.values()), pinned  # each ran batches
    finally:
        stop_and_close(pid, zygote, chan, bells)
