"""`ringserve batch` as users run it: a real process, real workers, real signals.

Its answers are checked against a real server's /v1/classify on the same texts.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from devkit.launcher import DATA, ROOT
from devkit.server import ServerProc, wait_for

BAD = {b"": "text is empty", b"  \t ": "text is empty", b"\xc3\x28 x": "text is not valid UTF-8"}


def column(path: Path, n: int, skip: int = 0) -> list[bytes]:
    rows = path.read_bytes().splitlines()[1 + skip : 1 + skip + n]
    return [r.split(b"\t")[0] for r in rows]


def mixed_lines() -> list[bytes]:
    """SST-2 and AG News texts interleaved, with bad lines at fixed places."""
    sst = column(DATA / "sst2" / "sample.tsv", 150)
    news = column(DATA / "ag_news" / "sample.tsv", 50)
    lines: list[bytes] = []
    for i in range(50):
        lines += [*sst[3 * i : 3 * i + 3], news[i]]
    for k, bad in enumerate(BAD):
        lines.insert(7 + 60 * k, bad)
    return lines


def batch_cmd(src: Path, out: Path, *extra: str) -> list[str]:
    return [
        sys.executable, "-m", "ringserve.service.cli", "batch", "--input", str(src),
        "--output", str(out),
        "--workers", "1", *extra,
    ]  # fmt: skip


def run_batch(src: Path, out: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    cmd = batch_cmd(src, out, *extra)
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=240)


def check_against_server(server: ServerProc, texts: list[bytes], out_lines: list[str]) -> None:
    answers = server.classify([t.decode() for t in texts])["results"]
    for got_line, want in zip(out_lines, answers, strict=True):
        got = json.loads(got_line)
        assert got["label"] == want["label"] and got["label_id"] == want["label_id"]
        diff = max(abs(a - b) for a, b in zip(got["scores"], want["scores"], strict=True))
        assert diff <= 1e-5, (got, want)


def test_batch_keeps_order_marks_bad_lines_and_matches_classify(
    tmp_path: Path, server: ServerProc
) -> None:
    lines = mixed_lines()
    src = tmp_path / "mixed.txt"
    src.write_bytes(b"\n".join(lines) + b"\n")
    out = tmp_path / "out.jsonl"
    run = run_batch(src, out)
    assert run.returncode == 0, run.stderr
    got = out.read_text().splitlines()
    assert len(got) == len(lines)
    for line, text in zip(got, lines, strict=True):
        if text in BAD:
            assert json.loads(line) == {"error": BAD[text]}
        else:
            assert "error" not in json.loads(line)
    sample = [i for i in range(0, len(lines), 7) if lines[i] not in BAD]  # short and long texts
    check_against_server(server, [lines[i] for i in sample], [got[i] for i in sample])
    assert not Path(str(out) + ".state.npy").exists()  # a finished run leaves nothing behind
    summary = json.loads(run.stderr.strip().splitlines()[-1])
    assert summary["lines"] == summary["written"] == len(lines) and summary["errors"] == 3


def test_batch_jsonl_and_tsv_inputs(tmp_path: Path, server: ServerProc) -> None:
    texts = column(DATA / "sst2" / "sample.tsv", 6, skip=400)
    docs = [json.dumps({"text": t.decode()}) for t in texts]
    pair = {"text": "a man plays a guitar", "text_pair": "someone makes music"}
    docs[2:2] = ["{not json", '{"texts": ["x"]}', json.dumps(pair)]
    src = tmp_path / "in.jsonl"
    src.write_text("\n".join(docs) + "\n")
    out = tmp_path / "out.jsonl"
    run = run_batch(src, out)
    assert run.returncode == 0, run.stderr
    got = out.read_text().splitlines()
    assert len(got) == len(docs)
    assert json.loads(got[2]) == {"error": "malformed JSON"}
    assert "must be an object" in json.loads(got[3])["error"]
    check_against_server(server, texts, got[:2] + got[5:])
    status, _, body = server.request("POST", "/v1/classify", pair)  # the pair as one input
    assert status == 200
    want, mine = json.loads(body), json.loads(got[4])
    assert want["label"] == mine["label"]
    assert max(abs(a - b) for a, b in zip(want["scores"], mine["scores"], strict=True)) <= 1e-5


def interrupt(src: Path, out: Path, log: Path, *extra: str) -> None:
    """Start a batch, SIGINT it once its first answers are in, and wait for its exit 130."""
    with open(log, "wb") as f:
        cmd = batch_cmd(src, out, "--progress-every-s", "0.1", *extra)
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=f, stderr=f)

    def started() -> bool:
        progress = [ln for ln in log.read_text().splitlines() if " texts/s" in ln]
        return bool(progress) and not progress[-1].startswith("ringserve batch: 0/")

    try:
        wait_for(started, 180, "first answers")
        proc.send_signal(signal.SIGINT)
        assert proc.wait(120) == 130, log.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()


def test_ctrl_c_leaves_valid_output_and_resume_finishes(tmp_path: Path, server: ServerProc) -> None:
    texts = column(DATA / "sst2" / "sample.tsv", 700, skip=600)
    src = tmp_path / "long.txt"
    src.write_bytes(b"\n".join(texts) + b"\n")
    out = tmp_path / "out.jsonl"
    log = tmp_path / "batch.log"
    interrupt(src, out, log)
    partial = out.read_text().splitlines()
    assert len(partial) < len(texts)
    for line in partial:  # a valid prefix: whole JSON lines only
        assert "scores" in json.loads(line)
    assert "--resume" in log.read_text()
    run = run_batch(src, out, "--resume")
    assert run.returncode == 0, run.stderr
    got = out.read_text().splitlines()
    assert len(got) == len(texts)
    resumed = json.loads(run.stderr.strip().splitlines()[-1])
    assert resumed["written"] == len(texts)
    assert not Path(str(out) + ".state.json").exists()
    sample = list(range(0, len(texts), 50))
    check_against_server(server, [texts[i] for i in sample], [got[i] for i in sample])


@pytest.mark.parametrize("suffix", [".jsonl", ".npy"])
def test_embed_resume_finishes_what_ctrl_c_left(
    tmp_path: Path, server: ServerProc, suffix: str
) -> None:
    """--task embed, stopped by Ctrl-C and resumed: the lines done before the stop are not
    scored again, and the output holds every line's vector, as /v1/embeddings gives it."""
    texts = column(DATA / "sst2" / "sample.tsv", 700, skip=600)
    src = tmp_path / "long.txt"
    src.write_bytes(b"\n".join(texts) + b"\n")
    out = tmp_path / f"out{suffix}"
    interrupt(src, out, tmp_path / "batch.log", "--task", "embed")
    done = int(np.count_nonzero(np.load(str(out) + ".state.npy")["status"] == 1))
    assert 0 < done < len(texts)
    if suffix == ".jsonl":
        assert all("embedding" in json.loads(line) for line in out.read_text().splitlines())
    else:
        assert not out.exists()  # the matrix is written whole at the end
    run = run_batch(src, out, "--task", "embed", "--resume")
    assert run.returncode == 0, run.stderr
    summary = json.loads(run.stderr.strip().splitlines()[-1])
    # Only what the stop left was scored again.
    assert summary["resumed"] == done and summary["errors"] == 0
    if suffix == ".jsonl":
        got = np.array([json.loads(line)["embedding"] for line in out.read_text().splitlines()])
    else:
        got = np.load(out)
    assert got.shape == (len(texts), 384) and not Path(str(out) + ".state.npy").exists()
    sample = list(range(0, len(texts), 25))
    body = {"input": [texts[i].decode() for i in sample]}
    status, _, data = server.request("POST", "/v1/embeddings", body)
    assert status == 200
    want = np.array([d["embedding"] for d in json.loads(data)["data"]])
    np.testing.assert_allclose(got[sample], want, atol=1e-6, rtol=0)


def summary_of(run: subprocess.CompletedProcess[str]) -> dict[str, object]:
    return dict(json.loads(run.stderr.strip().splitlines()[-1]))


def test_batch_precision_auto_scores_with_the_chosen_precision_and_says_which(
    tmp_path: Path, server: ServerProc, default_model: str
) -> None:
    """`--precision auto` resolves as serve does (the artifact's published costs, this CPU's
    flags), says the choice on stderr and in the summary, and the lines are that precision's:
    not fp32's scores unless fp32 was chosen, with the same decisions on nearly every text."""
    from ringserve.service.models.precision import auto_precision
    from ringserve.workers.artifact import load_manifest
    from ringserve.workers.cpu import BF16_FLAGS, cpu_flags

    texts = column(DATA / "sst2" / "sample.tsv", 120, skip=1500)
    src = tmp_path / "in.txt"
    src.write_bytes(b"\n".join(texts) + b"\n")
    m = load_manifest(default_model)
    cpu_bf16 = bool(cpu_flags() & set(BF16_FLAGS))
    want, _ = auto_precision(m.int8, bool(m.int8_file), m.bf16, cpu_bf16, m.int8_checked)
    runs = {"auto": want} | ({"int8": "int8"} if m.int8_file else {})
    fp32 = server.classify([t.decode() for t in texts])["results"]
    for asked, chosen in runs.items():
        out = tmp_path / f"{asked}.jsonl"
        run = run_batch(src, out, "--precision", asked)
        assert run.returncode == 0, run.stderr
        assert summary_of(run)["precision"] == chosen
        if asked == "auto":
            assert f"--precision auto: serving {chosen} (" in run.stderr
        got = [json.loads(line) for line in out.read_text().splitlines()]
        same = sum(g["label_id"] == f["label_id"] for g, f in zip(got, fp32, strict=True))
        assert same >= 0.95 * len(texts)
        drift = max(
            abs(a - b)
            for g, f in zip(got, fp32, strict=True)
            for a, b in zip(g["scores"], f["scores"], strict=True)
        )
        assert (drift <= 1e-5) == (chosen == "fp32"), (asked, chosen, drift)


def test_batch_refuses_a_precision_this_cpu_cannot_run(tmp_path: Path) -> None:
    from ringserve.workers.cpu import BF16_FLAGS, cpu_flags

    src = tmp_path / "in.txt"
    src.write_text("a gripping film\n")
    run = run_batch(src, tmp_path / "out.jsonl", "--precision", "fp16")
    assert run.returncode != 0 and "fp16 runs on CUDA only" in run.stderr
    if not cpu_flags() & set(BF16_FLAGS):
        run = run_batch(src, tmp_path / "out.jsonl", "--precision", "bf16")
        assert run.returncode != 0 and "needs a CPU with" in run.stderr
