"""`ringserve serve --config FILE` (issue 45), black-box: one TOML file serves two models with
their own settings; a flag and a RINGSERVE_* variable win over the file; a bad file is refused
before anything starts, naming the key and the line; `config show` and `config check`; SIGHUP
re-reads the model tables (one added, one removed) while another model keeps answering.

One module server (1 worker, no spare) serves both models: the default SST-2 artifact twice,
as `strict` (TorchScript, texts over 64 tokens refused, batched at bulk) and `loose` (ONNX Runtime,
batches of 4), the
second from a copy that keeps prompts (as sentence-transformers' directories do; its default
`passage`), whose table makes `query` its default prompt.
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

import pytest
from ringserve.workers.artifact import compute_fingerprint

from devkit.launcher import ROOT, inherited_env
from devkit.server import ServerProc, serving, wait_for

pytestmark = pytest.mark.timeout(300)

LONG = "a long review that goes on and on " * 80  # far past the model's 128 tokens
TABLES = """
[models.strict]
path = "{model}"
long-text = "refuse"
runtime = "torch"
priority = "bulk"
max-length = 64

[models.loose]
path = "{prompted}"
max_batch = 4
prompt-name = "query"
"""
PROMPTS = {"query": "query: ", "passage": "passage: "}


def prompted_copy(model: str, where: Path) -> str:
    """The default artifact with prompts in its manifest (its files linked, not copied), as
    factory/build.py keeps a sentence-transformers directory's, `passage` its default."""
    where.mkdir()
    for f in Path(model).iterdir():
        if f.name != "manifest.json":
            (where / f.name).symlink_to(f)
    raw = json.loads((Path(model) / "manifest.json").read_text())
    raw["extra"] |= {"prompts": PROMPTS, "default_prompt_name": "passage"}
    (where / "manifest.json").write_text(json.dumps(raw))
    raw["fingerprint"] = compute_fingerprint(where)
    (where / "manifest.json").write_text(json.dumps(raw))
    return str(where)


def write_config(path: Path, model: str, tables: str = TABLES) -> Path:
    path.write_text(
        "# the server of test_config_serve.py\n"
        "workers = 2       # --workers 1 wins\n"
        "max-texts = 100   # RINGSERVE_MAX_TEXTS=3 wins\n"
        "spares = 0\n"
        "no_docs_page = true\n" + tables.format(model=model, prompted=path.parent / "prompted")
    )
    return path


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ringserve.service.cli", *args], cwd=ROOT,
        env=inherited_env(), capture_output=True, text=True, timeout=60,
    )  # fmt: skip


@pytest.fixture(scope="module")
def config_path(tmp_path_factory: pytest.TempPathFactory, default_model: str) -> Path:
    where = tmp_path_factory.mktemp("cfg")
    prompted_copy(default_model, where / "prompted")
    return write_config(where / "ringserve.toml", default_model)


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory, config_path: Path) -> Iterator[ServerProc]:
    args = ["--config", str(config_path), "--workers", "1"]
    env = {"RINGSERVE_MAX_TEXTS": "3"}
    with serving(ServerProc(tmp_path_factory.mktemp("srv"), args, env), 1) as server:
        yield server


def post(srv: ServerProc, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    status, _, data = srv.request("POST", "/v1/classify", body)
    return status, json.loads(data)


def model_doc(srv: ServerProc, name: str) -> dict[str, Any]:
    status, _, data = srv.request("GET", f"/v1/models/{name}")
    assert status == 200, (status, data)
    doc: dict[str, Any] = json.loads(data)
    return doc


def test_two_models_serve_with_their_own_settings(srv: ServerProc) -> None:
    assert model_doc(srv, "strict")["runtime"] == "torch"
    assert model_doc(srv, "loose")["runtime"] == "onnx"  # auto: the artifact has model.onnx
    status, doc = post(srv, {"text": LONG, "model": "strict"})
    assert status == 413 and "max_length" in json.dumps(doc), doc
    status, doc = post(srv, {"text": LONG, "model": "loose"})
    assert status == 200, doc
    # the same short text scores alike on both (TorchScript and ONNX Runtime agree to 1e-5)
    a = post(srv, {"text": "a fine film", "model": "strict"})[1]
    b = post(srv, {"text": "a fine film", "model": "loose"})[1]
    assert a["label"] == b["label"], (a, b)
    assert max(abs(x - y) for x, y in zip(a["scores"], b["scores"], strict=True)) < 1e-4


def vectors(srv: ServerProc, **named: str) -> list[list[float]]:
    body = {"input": ["a fine film", "dull"], "model": "loose", **named}
    status, _, data = srv.request("POST", "/v1/embeddings", body)
    assert status == 200, data
    return [row["embedding"] for row in json.loads(data)["data"]]


def test_the_table_names_the_default_prompt(srv: ServerProc) -> None:
    """`prompt-name = "query"` over the artifact's `passage`: a request that names no prompt
    is embedded with `query: ` before it (OpenAI's route and TEI's), and /v1/models says so."""
    plain = vectors(srv)
    assert plain == vectors(srv, prompt_name="query")
    assert max(abs(a - b) for a, b in zip(plain[0], vectors(srv, prompt_name="passage")[0],
                                          strict=True)) > 1e-3  # fmt: skip
    status, _, data = srv.request("POST", "/embed", {"inputs": "dull", "model": "loose"})
    assert status == 200 and json.loads(data)[0] == pytest.approx(plain[1], abs=1e-6), data
    doc = model_doc(srv, "loose")
    assert (doc["default_prompt_name"], doc["prompts"]) == ("query", PROMPTS), doc
    assert "prompts" not in model_doc(srv, "strict")


def bulk_texts(srv: ServerProc) -> dict[str, tuple[str, int]]:
    status, _, data = srv.request("GET", "/v1/stats")
    assert status == 200, data
    return {n: (m["priority"], m["bulk_texts"]) for n, m in json.loads(data)["models"].items()}


def test_a_bulk_model_is_batched_at_bulk(srv: ServerProc) -> None:
    """`priority = "bulk"`: every text of `strict` is admitted at bulk, even one that asks for
    interactive (a request may only lower a priority); `loose` stays interactive unless a
    request lowers its own."""
    before = bulk_texts(srv)
    assert (before["strict"][0], before["loose"][0]) == ("bulk", "interactive"), before
    interactive = {"X-Priority": "interactive"}
    body = {"texts": ["one", "two"], "model": "strict"}
    assert srv.request("POST", "/v1/classify", body, interactive)[0] == 200
    assert post(srv, {"text": "three", "model": "loose"})[0] == 200
    lowered = {"text": "four", "model": "loose"}
    assert srv.request("POST", "/v1/classify", lowered, {"X-Priority": "bulk"})[0] == 200
    after = bulk_texts(srv)
    assert after["strict"][1] - before["strict"][1] == 2, (before, after)
    assert after["loose"][1] - before["loose"][1] == 1, (before, after)


def test_the_table_lowers_max_length(srv: ServerProc) -> None:
    """`max-length = 64` on `strict` (long texts refused): a text of about 80 tokens, within the
    artifact's own max_length, is refused at 64, by the worker that tokenizes it; `loose` (the
    artifact's max_length) answers it. /v1/models says 64."""
    text = "a long review that goes on and on " * 10
    status, doc = post(srv, {"text": text, "model": "strict"})
    assert status == 413 and doc["max_length"] == 64 and doc["tokens"] > 64, doc
    assert "over the model's max_length of 64" in doc["error"], doc
    assert post(srv, {"text": text, "model": "loose"})[0] == 200
    assert post(srv, {"text": "a fine film", "model": "strict"})[0] == 200
    assert model_doc(srv, "strict")["max_length"] == 64
    assert model_doc(srv, "loose")["max_length"] > 80


def test_a_flag_and_a_variable_win_over_the_file(srv: ServerProc) -> None:
    serving_workers = [w for w in srv.status()["workers"] if w["id"] >= 0]
    assert len(serving_workers) == 1  # --workers 1 over the file's 2
    status, doc = post(srv, {"texts": ["one", "two", "three", "four"], "model": "loose"})
    # RINGSERVE_MAX_TEXTS=3 over the file's 100
    assert status == 400 and "length <= 3 - at `$.texts`" in doc["error"], doc
    assert srv.request("GET", "/docs")[0] == 404  # the file's no_docs_page = true
    assert "/docs" not in json.loads(srv.request("GET", "/openapi.json")[2])["paths"]


def test_config_show_says_where_each_setting_came_from(config_path: Path) -> None:
    shown = cli("config", "show", "--config", str(config_path), "--workers", "1")
    assert shown.returncode == 0, shown.stderr
    rows = {line.split()[0]: line for line in shown.stdout.splitlines()}
    assert rows["workers"].split()[1:] == ["1", "flag"]
    assert rows["max-texts"].split()[1:] == ["100", f"{config_path}:3"]
    assert rows["threads"].split()[1:] == ["1", "default"]
    assert "long-text=refuse max-length=64 priority=bulk" in rows["models.strict"]
    checked = cli("config", "check", str(config_path))
    assert checked.returncode == 0 and "ok (4 settings, 2 models)" in checked.stdout


@pytest.mark.parametrize(
    ("bad", "said"),
    [
        ("max-txets = 3\n", "key max-txets: unknown key"),
        ("max-texts = '3'\n", "key max-texts: expected integer, got string '3'"),
        ("[models.x]\npath = '{model}'\nprompt_name = 'query'\n",
         "key models.x.prompt-name: 'query' is not one of the model's prompts: none"),
        ("[models.x]\npath = '{model}'\nmax-length = 16\nlong-text = 'window'\n",
         "key models.x.max-length: 16 is too short for windows: --window-stride 32 must stay "
         "below 12"),
    ],
)  # fmt: skip
def test_a_bad_file_is_refused_before_anything_starts(
    tmp_path: Path, default_model: str, bad: str, said: str
) -> None:
    path = tmp_path / "bad.toml"
    path.write_text("# line 1\nspares = 0\n" + bad.format(model=default_model))
    line = 3 if bad.startswith("max") else 5
    checked = cli("config", "check", str(path))
    assert checked.returncode == 2 and f"{path}:{line}: {said}" in checked.stderr, checked
    control = tmp_path / "never.sock"
    served = cli("serve", "--config", str(path), "--port", "0", "--control", str(control))
    assert served.returncode == 2 and f"{path}:{line}: {said}" in served.stderr, served
    assert not control.exists() and "serving" not in served.stderr


def test_sighup_rereads_the_model_tables(
    srv: ServerProc, config_path: Path, default_model: str
) -> None:
    """`strict` goes, `third` comes (long texts in windows), `loose` changes (long texts
    refused from now on, swapped in place); `loose` answers throughout."""
    stop = threading.Event()
    answers: list[int] = []

    def traffic() -> None:
        while not stop.is_set():
            answers.append(post(srv, {"text": "steady", "model": "loose"})[0])

    thread = threading.Thread(target=traffic)
    thread.start()
    try:
        wait_for(lambda: len(answers) >= 3, 30, "traffic to loose")
        tables = TABLES.split("[models.loose]")[1] + 'long_text = "refuse"\n'
        third = '\n[models.third]\npath = "{model}"\nlong-text = "window"\n'
        write_config(config_path, default_model, "[models.loose]" + tables + third)
        os.kill(srv.pid, signal.SIGHUP)

        def names() -> set[str]:
            _, _, data = srv.request("GET", "/v1/models")
            return {m["name"] for m in json.loads(data)["models"] if m["state"] == "READY"}

        wait_for(lambda: names() == {"loose", "third"}, 180, "strict gone and third served")
        refused = lambda: post(srv, {"text": LONG, "model": "loose"})[0] == 413  # noqa: E731
        wait_for(refused, 120, "loose swapped in place: long texts refused")
        wait_for(lambda: "config_models_changed" in srv.logs(), 10, "the change logged")
        during = len(answers)
        wait_for(lambda: len(answers) > during + 3, 30, "loose answering after the reload")
    finally:
        stop.set()
        thread.join(60)
    assert answers and set(answers) == {200}, sorted(set(answers))
    logged = next(line for line in srv.logs().splitlines() if "config_models_changed" in line)
    assert '"added": ["third"]' in logged and '"removed": ["strict"]' in logged, logged
    assert '"changed": ["loose"]' in logged, logged
    status, doc = post(srv, {"text": LONG, "model": "third"})
    assert status == 200 and doc.get("windows", 0) > 1, doc
    assert post(srv, {"text": "x", "model": "strict"})[0] == 404
