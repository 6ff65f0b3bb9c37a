"""One worker serving two models, run in this process over a real channel (no server): each
request reaches the model its index names and is answered exactly as that model's own
one-model worker answers it; an index the worker does not hold is answered status 5; each
model's memory is in the control block."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from ringserve.factory import export
from ringserve.shm import layout as L
from ringserve.shm.channel import Channel, Doorbells
from ringserve.shm.control import model_rss
from ringserve.workers.artifact import ArtifactError
from ringserve.workers.spec import ModelRef, WorkerSpec
from ringserve.workers.worker import Worker

from devkit.hfmodels import MAX_LENGTH, save_model

TEXTS = [
    "a gripping, beautiful film",
    "a dull, lifeless mess",
    "ok",
    "the plot twists are clever but the acting " * 12,  # cut at either model's max length
]
PAIRS = [("a man sleeps", "a person rests"), ("it rains", "the sun shines")]
SERIAL = iter(range(970_000, 980_000))
NLI = 2  # the tiny model's index: any index but 0 is marked on the wire


@pytest.fixture(scope="module")
def nli(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A tiny random 3-label BERT (devkit/hfmodels.py), exported as `ringserve export` does."""
    root = tmp_path_factory.mktemp("nli")
    source = save_model("bert", root / "src")
    out = root / "art"
    args = ["--from", str(source), "--out", str(out), "--max-length", str(MAX_LENGTH)]
    assert export.main(args) == 0
    return str(out)


class InProcess:
    """A Worker booted in this process on a channel of its own; ask() plays the front-end."""

    def __init__(self, model_dir: str, models: tuple[ModelRef, ...], runtime: str) -> None:
        serial = next(SERIAL)
        self.channel = Channel.create(os.getpid(), serial, 64, 256)
        self.bells = Doorbells()
        spec = WorkerSpec(
            serial=serial, parent_pid=os.getppid(), cpus=[0], threads=1, device="cpu",
            model_dir=model_dir, channel=self.channel.names, buckets=(), max_batch=8,
            max_delay_ms=0.0, doorbell=self.bells.request, eventfd=self.bells.answer,
            runtime=runtime, models=models,
        )  # fmt: skip
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
        """Send (model index, text or pair) requests at once; each msg id's (status, scores)."""
        msgs = []
        for msg_id, (index, text) in enumerate(requests):
            body = (
                text.encode()
                if isinstance(text, str)
                else L.PAIR_SEPARATOR.join(t.encode() for t in text)
            )
            msgs.append((msg_id, L.with_model(body, index), 0))
        assert self.channel.requests.write_many(msgs) == len(msgs)
        w = self.worker
        assert w.take_requests() == len(msgs)
        while True:
            index, wait = w.turns.next(0)  # max_delay 0: whatever waits is due
            if index is None:
                assert wait == -1
                break
            w.run_next(w.models[index])
        answers = {}
        for msg_id, _, payload in self.channel.responses.read():
            status, _, label, n, *_ = L.RESPONSE.unpack_from(payload)
            scores = np.frombuffer(payload[L.RESPONSE_SIZE :], dtype=np.float32)
            answers[msg_id] = (status, label, scores[:n].tobytes())
        assert sorted(answers) == list(range(len(msgs)))
        return answers

    def close(self) -> None:
        self.worker.close()
        self.channel.close()
        self.channel.unlink()
        self.bells.close()


@pytest.fixture(params=["torch", "onnx"])
def runtime(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def workers(default_model: str, nli: str, runtime: str) -> Iterator[dict[str, InProcess]]:
    """The two-model worker, and each model's own one-model worker (the old spec: no models)."""
    made: dict[str, InProcess] = {}
    try:
        both = (ModelRef(0, "sst2", 1, default_model), ModelRef(NLI, "nli", 1, nli))
        made["both"] = InProcess.booted(default_model, both, runtime)
        made["sst2"] = InProcess.booted(default_model, (), runtime)
        made["nli"] = InProcess.booted(nli, (), runtime)
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
        assert made.worker.loader.current == refs[1]
        assert not made.worker.cpu_model_ok  # main() exits EXIT_BOOT_ERROR, not a device's
        assert made.worker.ctl.get("state") == L.W_STARTING
    finally:
        made.close()
