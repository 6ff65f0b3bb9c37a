"""Long texts: cut at either end, refused, or scored in windows, against real servers.

Every expectation is built here independently of the server: the windows and cuts from the
artifact's tokenizer.json with the `tokenizers` library and plain list slicing, their scores
from the model run in this process on those ids (ONNX Runtime, as the server's workers run it).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from ringserve.shm import layout as L
from ringserve.wire.client import BinaryClient
from ringserve.wire.frames import TRUNCATED, WINDOWED
from ringserve.workers.artifact import load_manifest, load_tokenizer
from ringserve.workers.batches import Item
from ringserve.workers.process.longtext import LongText, combine
from tokenizers import Tokenizer

from devkit.launcher import ROOT
from devkit.longtext import GRIM, HAPPY, MAX_LEN, STRIDE, long_text, raw, windows_of
from devkit.server import ServerProc, serving, wait_for


def cut(tok: Tokenizer, text: str, left: bool, max_len: int = MAX_LEN) -> list[int]:
    cls, sep = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
    body = tok.encode(text, add_special_tokens=False).ids
    keep = body[-(max_len - 2) :] if left else body[: max_len - 2]
    return [cls, *keep, sep]


class Model:
    """The artifact's model in this process, one row at a time (padded to its own length)."""

    def __init__(self, model_dir: str) -> None:
        from devkit.models import raw_runner

        self.runner = raw_runner(model_dir, "onnx", "fp32", 4)
        self.token_types = load_manifest(model_dir).token_types

    def scores(self, ids: list[int], types: list[int] | None = None) -> np.ndarray:
        item = Item(0, 0, 0, ids, types=types if self.token_types else None)
        self.runner.fill(len(ids), [item])
        return np.array(self.runner.forward(len(ids), 1)[0], dtype=np.float32)

    def windowed(self, windows: list[tuple[list[int], list[int]]]) -> np.ndarray:
        return combine([self.scores(ids, types) for ids, types in windows], "softmax")


@pytest.fixture(scope="module")
def model(default_model: str) -> Model:
    return Model(default_model)


@pytest.fixture(scope="module")
def tok(default_model: str) -> Tokenizer:
    return raw(default_model)


def serve(factory: pytest.TempPathFactory, name: str, *args: str) -> Iterator[ServerProc]:
    with serving(
        ServerProc(factory.mktemp(name), ["--workers", "1", "--spares", "0", *args]), 1
    ) as srv:
        yield srv


@pytest.fixture(scope="module")
def windowing(tmp_path_factory: pytest.TempPathFactory, default_model: str) -> Iterator[ServerProc]:
    """--long-text window, stride 32, at most 16 windows."""
    yield from serve(tmp_path_factory, "win", "--long-text", "window", "--window-stride", "32")


@pytest.fixture(scope="module")
def cutting(tmp_path_factory: pytest.TempPathFactory, default_model: str) -> Iterator[ServerProc]:
    """The default: --long-text truncate."""
    yield from serve(tmp_path_factory, "cut")


def classify(srv: ServerProc, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    status, _, data = srv.request("POST", "/v1/classify", body)
    return status, json.loads(data)


# -- the tokenizing, in process ----------------------------------------------------------------
def test_windows_and_cuts_match_the_tokenizer_by_hand(default_model: str, tok: Tokenizer) -> None:
    lt = LongText(load_tokenizer(default_model, MAX_LEN), MAX_LEN, "window", STRIDE, 64, False)
    words = (HAPPY + GRIM).split()
    for n_words in (180, 200, 230, 231, 260, 400, 777, 1500):  # around the window edges too
        text = " ".join(words[i % len(words)] for i in range(n_words))
        n = len(tok.encode(text).ids)
        (plan,) = lt.plan([text], [0])
        assert plan.tokens == n
        if n <= MAX_LEN:
            assert [p.ids for p in plan.pieces] == [tok.encode(text).ids]
            assert plan.flags == 0
            continue
        assert plan.flags == L.RSP_WINDOWED
        assert [p.ids for p in plan.pieces] == [w[0] for w in windows_of(tok, text)]
        query = "is it any good?"
        (pair,) = lt.plan([(query, text)], [0])
        assert pair.tokens == len(tok.encode(query, text).ids)
        assert [p.ids for p in pair.pieces] == [w[0] for w in windows_of(tok, text, query)]
        right, left, refused = lt.plan(
            [text] * 3, [L.OPT_CUT, L.OPT_CUT | L.OPT_LEFT, L.OPT_REFUSE]
        )
        assert right.pieces[0].ids == cut(tok, text, left=False)
        assert left.pieces[0].ids == cut(tok, text, left=True)
        assert right.flags == left.flags == L.RSP_TRUNCATED
        assert refused.pieces == [] and refused.refusal == (0, MAX_LEN)


def test_too_many_windows_and_bad_settings_are_refused(default_model: str, tok: Tokenizer) -> None:
    base = load_tokenizer(default_model, MAX_LEN)
    lt = LongText(base, MAX_LEN, "window", STRIDE, 3, False)
    text = long_text(4, tok)
    need = len(windows_of(tok, text))
    (plan,) = lt.plan([text], [0])
    assert need > 3 and plan.refusal == (need, 3) and plan.flags == L.RSP_WINDOWED
    # A pair whose first text leaves the stride or less for the second: refused (the library
    # itself would panic, which no except clause of the worker's catches).
    room = MAX_LEN - 3 - STRIDE
    for words, refusal in ((room, (0, 3)), (room - 1, None)):
        query = " ".join(["word"] * words)  # one token a word
        (pair,) = lt.plan([(query, text)], [0])
        if refusal is not None:
            assert pair.refusal == refusal and pair.pieces == []
        else:  # one token of room past the stride: a window a token, far over 3
            assert pair.refusal is not None and pair.refusal[0] > 3
    for stride, windows in ((-1, 4), (MAX_LEN - 4, 4), (0, 0)):
        with pytest.raises(ValueError):
            LongText(base, MAX_LEN, "window", stride, windows, False)
    with pytest.raises(ValueError):
        LongText(base, MAX_LEN, "span", STRIDE, 4, False)
    LongText(base, 24, "truncate", STRIDE, 16, False)  # a stride that no window needs is fine


def test_combining_windows() -> None:
    a = np.array([0.2, 0.8], dtype=np.float32)
    b = np.array([0.6, 0.4], dtype=np.float32)
    assert np.allclose(combine([a, b], "softmax"), [0.4, 0.6])
    assert np.allclose(combine([a, b], "sigmoid"), [0.6, 0.8])


# -- served ------------------------------------------------------------------------------------
def test_a_short_text_scores_the_same_in_every_mode(
    windowing: ServerProc, cutting: ServerProc
) -> None:
    text = "a gripping, beautifully made film"
    bodies = [
        {"text": text},
        {"text": text, "truncate": True},
        {"text": text, "truncate": False},
        {"text": text, "truncate": True, "truncation_direction": "left"},
    ]
    answers = [classify(srv, b) for srv in (windowing, cutting) for b in bodies]
    assert all(status == 200 for status, _ in answers), answers
    first = answers[0][1]
    assert set(first) == {"label", "label_id", "scores"}  # says nothing it need not
    assert all(doc == first for _, doc in answers)  # the very same floats
    for srv in (windowing, cutting):
        with BinaryClient(port=srv.binary_port) as client:
            got = client.classify(text)
        assert got.ok and got.flags == 0
        assert np.allclose(got.scores, first["scores"], atol=0, rtol=0)


def test_windowed_scores_combine_the_windows_scores(
    windowing: ServerProc, tok: Tokenizer, model: Model
) -> None:
    text = long_text(5, tok)
    windows = windows_of(tok, text)
    rows = metric(windowing, "ringserve_batch_size_sum")
    status, doc = classify(windowing, {"text": text})
    assert status == 200, doc
    assert doc["windows"] == len(windows) >= 5
    # Each window was a row of a batch (the module's tests run one at a time).
    wait_for(
        lambda: metric(windowing, "ringserve_batch_size_sum") - rows == len(windows), 10, "rows"
    )
    assert doc["tokens"] == len(tok.encode(text).ids)
    assert "truncated" not in doc
    assert np.abs(np.array(doc["scores"]) - model.windowed(windows)).max() <= 1e-5
    # The same text among short ones in one request, and over the binary protocol.
    status, batch = classify(windowing, {"texts": ["fine", text, "awful"]})
    assert status == 200 and np.allclose(batch["results"][1]["scores"], doc["scores"], atol=1e-5)
    with BinaryClient(port=windowing.binary_port) as client:
        got = client.classify(text)
    assert got.ok and got.flags == WINDOWED
    assert np.abs(np.array(got.scores) - np.array(doc["scores"])).max() <= 1e-5


def test_a_pair_is_windowed_on_its_second_text(
    windowing: ServerProc, tok: Tokenizer, model: Model
) -> None:
    query, passage = "Is the film worth seeing?", long_text(3, tok, GRIM, HAPPY)
    windows = windows_of(tok, passage, query)
    status, doc = classify(windowing, {"text": query, "text_pair": passage})
    assert status == 200, doc
    assert doc["windows"] == len(windows) and doc["tokens"] == len(tok.encode(query, passage).ids)
    assert np.abs(np.array(doc["scores"]) - model.windowed(windows)).max() <= 1e-5


def test_truncate_false_is_refused_with_both_counts(windowing: ServerProc, tok: Tokenizer) -> None:
    text = long_text(2, tok)
    n = len(tok.encode(text).ids)
    status, doc = classify(windowing, {"text": text, "truncate": False})
    assert status == 413, doc
    assert doc["tokens"] == n and doc["max_length"] == MAX_LEN
    assert str(n) in doc["error"] and str(MAX_LEN) in doc["error"]
    body = {
        "inputs": [{"name": "text", "datatype": "BYTES", "shape": [1], "data": [text]}],
        "parameters": {"truncate": False},
    }
    status, _, data = windowing.request("POST", f"/v2/models/{model_name(windowing)}/infer", body)
    assert status == 413 and json.loads(data)["tokens"] == n
    for bad in ({"truncate": "no"}, {"truncation_direction": "middle"}):
        status, doc = classify(windowing, {"text": text, **bad})
        assert status == 400, doc


def test_left_keeps_the_last_tokens(
    cutting: ServerProc, windowing: ServerProc, tok: Tokenizer, model: Model
) -> None:
    text = long_text(3, tok)  # happy start, grim end
    n = len(tok.encode(text).ids)
    right = model.scores(cut(tok, text, left=False))
    left = model.scores(cut(tok, text, left=True))
    assert right.argmax() != left.argmax()  # the two ends differ, so the test can tell them
    for srv in (cutting, windowing):
        for direction, want in (("right", right), ("left", left)):
            body = {"text": text, "truncate": True, "truncation_direction": direction}
            status, doc = classify(srv, body)
            assert status == 200, doc
            assert doc["truncated"] is True and doc["tokens"] == n and "windows" not in doc
            assert np.abs(np.array(doc["scores"]) - want).max() <= 1e-5
    status, doc = classify(cutting, {"text": text})  # the default: cut on the right
    assert doc["truncated"] is True and np.abs(np.array(doc["scores"]) - right).max() <= 1e-5
    with BinaryClient(port=cutting.binary_port) as client:
        got = client.classify(text)
    assert got.ok and got.flags == TRUNCATED


def model_name(srv: ServerProc) -> str:
    _, _, data = srv.request("GET", "/v1/model")
    name: str = json.loads(data)["name"]
    return name


def test_kserve_parameters_choose_and_say(windowing: ServerProc, tok: Tokenizer) -> None:
    text = long_text(2, tok)
    n = len(tok.encode(text).ids)
    path = f"/v2/models/{model_name(windowing)}/infer"
    inputs = [{"name": "text", "datatype": "BYTES", "shape": [2], "data": ["short", text]}]
    status, _, data = windowing.request("POST", path, {"inputs": inputs})
    assert status == 200, data
    params = json.loads(data)["parameters"]
    assert params["truncated"] is False and params["tokens"].split(",")[1] == str(n)
    assert params["windows"].split(",")[0] == "0" and int(params["windows"].split(",")[1]) >= 2
    body = {"inputs": inputs, "parameters": {"truncate": True, "truncation_direction": "left"}}
    status, _, data = windowing.request("POST", path, body)
    assert status == 200, data
    assert json.loads(data)["parameters"] == {"truncated": True, "tokens": f"3,{n}"}


def test_too_many_windows_is_a_clear_413(windowing: ServerProc, tok: Tokenizer) -> None:
    text = long_text(18, tok)
    need = len(windows_of(tok, text))
    status, doc = classify(windowing, {"text": text})
    assert status == 413, doc
    assert doc["windows"] == need and doc["max_windows"] == 16
    assert "--max-windows 16" in doc["error"]
    with BinaryClient(port=windowing.binary_port) as client:
        assert client.classify(text).status == L.STATUS_BAD_REQUEST  # the contract's status 1


def test_refuse_as_the_server_default(start_server: Any, tok: Tokenizer) -> None:
    srv = start_server("--workers", "1", "--spares", "0", "--long-text", "refuse", workers=1)
    text = long_text(2, tok)
    status, doc = classify(srv, {"text": text})
    assert status == 413 and doc["max_length"] == MAX_LEN, doc
    status, doc = classify(srv, {"text": text, "truncate": True})
    assert status == 200 and doc["truncated"] is True
    with BinaryClient(port=srv.binary_port) as client:
        assert client.classify(text).status == L.STATUS_BAD_REQUEST
        assert client.classify("short and sweet").ok


# -- failure -----------------------------------------------------------------------------------
def sixteen_windows(tok: Tokenizer) -> str:
    text = HAPPY * 12
    while len(windows_of(tok, text)) < 16:
        text += GRIM
    assert len(windows_of(tok, text)) == 16
    return text


def metric(srv: ServerProc, name: str) -> int:
    _, _, data = srv.request("GET", "/metrics")
    for line in data.decode().splitlines():
        if line.startswith(name + " "):
            return int(float(line.split()[-1]))
    raise AssertionError(f"no {name} in /metrics")


def batches_run(srv: ServerProc) -> int:
    return metric(srv, "ringserve_batch_size_count")


def test_a_worker_killed_mid_text_loses_nothing(
    start_server: Any, tok: Tokenizer, model: Model
) -> None:
    """The worker is stopped after some of the text's 8 batches (2 windows of 256 tokens in a
    512-token batch) and killed there: the answer still comes whole, from the spare."""
    srv = start_server(
        "--workers", "1", "--spares", "1", "--long-text", "window",
        env={"RINGSERVE_TEST_BATCH_DELAY_MS": "150"}, workers=1,
    )  # fmt: skip
    srv.wait_spares(1)
    text = sixteen_windows(tok)
    want = model.windowed(windows_of(tok, text))
    (victim,) = srv.worker_pids().values()
    before = batches_run(srv)
    answer: list[tuple[int, dict[str, Any]]] = []
    post = threading.Thread(target=lambda: answer.append(classify(srv, {"text": text})))
    post.start()
    try:
        wait_for(lambda: batches_run(srv) >= before + 2, 30, "some of the windows scored")
        os.kill(victim, signal.SIGSTOP)
        done = batches_run(srv) - before
        assert 2 <= done < 8 and srv.status()["queue_depth"] == 1, done  # mid-text
        os.kill(victim, signal.SIGKILL)
        post.join(60)
    finally:
        if post.is_alive():
            post.join(60)
    ((status, doc),) = answer
    assert status == 200, doc
    assert doc["windows"] == 16 and doc["tokens"] == len(tok.encode(text).ids)
    assert np.abs(np.array(doc["scores"]) - want).max() <= 1e-5
    assert victim not in srv.worker_pids().values()


# -- ringserve batch ---------------------------------------------------------------------------
def test_batch_windows_and_refuses_as_serve_does(
    tmp_path: Path, default_model: str, tok: Tokenizer, model: Model
) -> None:
    long = long_text(3, tok)
    src = tmp_path / "in.jsonl"
    rows = [{"text": "a fine film"}, {"text": long}, {"text": long_text(20, tok)}]
    src.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "out.jsonl"
    cmd = [
        sys.executable, "-m", "ringserve.service.cli", "batch", "--input", str(src),
        "--output", str(out),
        "--workers", "1", "--long-text", "window",
    ]  # fmt: skip
    subprocess.run(cmd, cwd=ROOT, check=True, timeout=300, capture_output=True)
    short, windowed, refused = [json.loads(x) for x in out.read_text().splitlines()]
    assert set(short) == {"label", "label_id", "scores"}
    assert windowed["windows"] == len(windows_of(tok, long))
    assert (
        np.abs(np.array(windowed["scores"]) - model.windowed(windows_of(tok, long))).max() <= 1e-5
    )
    assert refused["max_windows"] == 16 and "--max-windows" in refused["error"]
    subprocess.run([*cmd[:-2], "--long-text", "truncate"], cwd=ROOT, check=True, timeout=300,
                   capture_output=True)  # fmt: skip
    cut_line = json.loads(out.read_text().splitlines()[1])
    assert cut_line["truncated"] is True and cut_line["tokens"] == len(tok.encode(long).ids)
