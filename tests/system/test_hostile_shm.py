"""Issue 56's attacks on shared memory and on the pool, each run against a real server while a
normal client classifies throughout: the attack is refused or bounded, the server stays up,
the client loses nothing (0 failed requests), and no segment is left behind.

- A client registers a system shared-memory region, then truncates its file: the next request
  that reads or writes it gets 400 (gRPC INVALID_ARGUMENT), never SIGBUS (exit 135 before).
- /dev/shm is full when a worker is to be spawned (a private 64 MiB tmpfs, mounted over
  /dev/shm for this server alone with `unshare --mount`; we run as root): the spawn is
  refused, logged with the reason, and tried again; the server serves on with its worker.
- The predictable name of a segment is taken first: the spawn creates another (random) name.
  Our names are random now, so the test has the server try the old predictable one first
  (RINGSERVE_TEST_PREDICTABLE_SEGMENTS), as anyone could have taken it before.
- A worker writes a malformed answer record: it is killed and replaced within 1 s, and what it
  held is rerouted. Nothing outside a worker can write its ring, so the worker lies through a
  test hook (RINGSERVE_TEST_LYING_WORKER, workers/process/lies.py).
- A reload (ctl reload, SIGHUP, the repository load call) onto an artifact that verifies but
  that workers cannot load: the old model keeps serving, and each caller is told why.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import tritonclient.utils.shared_memory as shm
from tritonclient.utils import InferenceServerException, serialize_byte_tensor

from devkit.load import Load
from devkit.server import ServerProc, segments_of, serving, wait_for

pytestmark = pytest.mark.timeout(600)

MODEL = "sst2-minilm"
TEXTS = ["a gripping, beautifully acted film", "dull and far too long", "it was fine"]
TMPFS_MIB = 64  # the private /dev/shm: one worker's segments (4.5 MiB) and room to fill


def events(srv: ServerProc, name: str) -> list[dict[str, Any]]:
    return [
        doc
        for line in srv.logs().splitlines()
        if line.startswith("{") and (doc := json.loads(line)).get("event") == name
    ]


def ready_pids(srv: ServerProc) -> dict[int, int]:
    """Slot -> pid of each ready serving worker."""
    rows = srv.status()["workers"]
    return {w["id"]: w["pid"] for w in rows if w["state"] == "ready" and w["id"] >= 0}


def texts_array() -> np.ndarray:
    return np.array([t.encode() for t in TEXTS], dtype=np.object_).reshape(len(TEXTS), 1)


# -- a registered region, truncated ----------------------------------------------------------------
def test_a_truncated_region_is_a_400_for_that_request_and_the_server_stays_up(
    tmp_path: Path, default_model: str, sst2_texts: list[str]
) -> None:
    args = ["--workers", "1", "--spares", "0"]
    with (
        serving(ServerProc(tmp_path, args, grpc=True), 1) as srv,
        Load(srv.port, sst2_texts, clients=3) as load,
    ):
        load.wait_ok(10)
        http = httpclient.InferenceServerClient(f"127.0.0.1:{srv.port}", network_timeout=120)
        rpc = grpcclient.InferenceServerClient(f"127.0.0.1:{srv.grpc_port}")
        data = serialize_byte_tensor(texts_array())
        size = len(data.item())  # tritonclient serializes BYTES into one bytes object
        key_in, key_out = f"/rs-cut-in-{srv.port}", f"/rs-cut-out-{srv.port}"
        region_in = shm.create_shared_memory_region("in", key_in, size)
        region_out = shm.create_shared_memory_region("out", key_out, 4096)
        try:
            shm.set_shared_memory_region(region_in, [data])
            for client, tag in ((http, "h"), (rpc, "g")):
                client.register_system_shared_memory(f"in-{tag}", key_in, size)
                client.register_system_shared_memory(f"out-{tag}", key_out, 4096)

            def infer(client: Any, mod: Any, tag: str) -> Any:
                inp = mod.InferInput("text", [len(TEXTS), 1], "BYTES")
                inp.set_shared_memory(f"in-{tag}", size)
                out = mod.InferRequestedOutput("scores")
                out.set_shared_memory(f"out-{tag}", 4 * 2 * len(TEXTS))
                return client.infer(MODEL, [inp], outputs=[out])

            for client, mod, tag in ((http, httpclient, "h"), (rpc, grpcclient, "g")):
                infer(client, mod, tag)  # whole: served from and into the regions
            # The attack: both files cut to nothing under the registered regions. This process
            # never touches its own mappings of them again (that would be its own SIGBUS).
            os.truncate(f"/dev/shm{key_in}", 0)
            for client, mod, tag in ((http, httpclient, "h"), (rpc, grpcclient, "g")):
                with pytest.raises(InferenceServerException, match="no longer whole") as err:
                    infer(client, mod, tag)
                assert err.value.status() in ("400", "StatusCode.INVALID_ARGUMENT")
            os.truncate(f"/dev/shm{key_in}", size)  # the input whole again (zeros): the
            os.truncate(f"/dev/shm{key_out}", 4)  # output cut: its write is refused the same
            with open(f"/dev/shm{key_in}", "r+b") as f:
                f.write(data.item())
            for client, mod, tag in ((http, httpclient, "h"), (rpc, grpcclient, "g")):
                with pytest.raises(InferenceServerException, match="no longer whole") as err:
                    infer(client, mod, tag)
                assert err.value.status() in ("400", "StatusCode.INVALID_ARGUMENT")
            assert os.stat(f"/dev/shm{key_out}").st_size == 4  # refused: not grown either
            assert srv.proc.poll() is None and srv.classify(TEXTS[0])["label"]
            load.wait_ok(10)
            for client in (http, rpc):
                client.unregister_system_shared_memory()
        finally:
            http.close()
            rpc.close()
            for region in (region_in, region_out):
                with contextlib.suppress(Exception):  # unmaps and unlinks, touching nothing
                    shm.destroy_shared_memory_region(region)
    assert load.failed() == 0, (load.outcomes, load.errors[:5])


# -- our own segments: a full /dev/shm, a squatted name --------------------------------------------
def fill(directory: str) -> str:
    """Take every byte the tmpfs has left; the filler's path."""
    path = os.path.join(directory, "filler")
    with open(path, "ab") as f:
        free = os.statvfs(directory).f_bavail * os.statvfs(directory).f_frsize
        with contextlib.suppress(OSError):
            os.posix_fallocate(f.fileno(), os.fstat(f.fileno()).st_size, free)
        chunk = bytes(1 << 16)
        with contextlib.suppress(OSError):  # what fallocate could not take: ENOSPC ends it
            while True:
                f.write(chunk)
                f.flush()
    return path


def test_a_full_dev_shm_refuses_the_spawn_and_the_server_serves_on(
    tmp_path: Path, default_model: str, sst2_texts: list[str]
) -> None:
    if shutil.which("unshare") is None or os.geteuid() != 0:
        pytest.skip("needs root and unshare(1) for a private /dev/shm")
    mount = f'mount -t tmpfs -o size={TMPFS_MIB}m tmpfs /dev/shm && exec "$@"'
    wrap = ("unshare", "--mount", "--propagation", "private", "sh", "-c", mount, "sh")
    srv = ServerProc(tmp_path, ["--workers", "1", "--spares", "0"], wrap=wrap)
    shm_fd = -1  # the server's private /dev/shm, read through it once the server is gone
    try:
        with serving(srv, 1):
            shm_dir = f"/proc/{srv.pid}/root/dev/shm"
            shm_fd = os.open(shm_dir, os.O_RDONLY | os.O_DIRECTORY)
            assert len([n for n in os.listdir(shm_dir) if n.startswith("rs_")]) == 3
            with Load(srv.port, sst2_texts, clients=3) as load:
                load.wait_ok(10)
                filler = fill(shm_dir)
                assert srv.ctl({"cmd": "scale", "workers": 2})["ok"]
                wait_for(lambda: len(events(srv, "worker_spawn_refused")) >= 2, 60, "refusals")
                refused = events(srv, "worker_spawn_refused")[0]
                assert refused["level"] == "error" and refused["worker"] == 1, refused
                assert "no room in /dev/shm" in refused["reason"] and refused["serving"] == 1
                assert srv.proc.poll() is None and len(ready_pids(srv)) == 1
                load.wait_ok(20)  # served on by the worker it has
                os.unlink(filler)  # room again: the refused spawn is tried again, and works
                wait_for(lambda: len(ready_pids(srv)) == 2, 120, "the second worker")
                load.wait_ok(10)
            assert load.failed() == 0, (load.outcomes, load.errors[:5])
        left = [n for n in os.listdir(shm_fd) if n.startswith("rs_")]
        assert not left, f"segments left in the private /dev/shm: {left}"
    finally:
        if shm_fd >= 0:
            os.close(shm_fd)


def test_a_squatted_segment_name_is_passed_over(
    tmp_path: Path, default_model: str, sst2_texts: list[str]
) -> None:
    env = {"RINGSERVE_TEST_PREDICTABLE_SEGMENTS": "1"}
    srv = ServerProc(tmp_path, ["--workers", "1", "--spares", "0"], env)
    # Taken at once, before the server (still importing) makes its first worker's segments.
    squats = [
        f"/dev/shm/rs_{srv.pid}_{serial}_{kind}"
        for serial in range(1, 6)
        for kind in ("req", "rsp", "ctl")
    ]
    for path in squats:
        with open(path, "xb") as f:
            f.write(b"taken")
    try:
        with serving(srv, 1), Load(srv.port, sst2_texts, clients=3) as load:
            load.wait_ok(10)
            (victim,) = ready_pids(srv).values()
            os.kill(victim, signal.SIGKILL)  # its replacement's names are squatted too
            wait_for(lambda: set(ready_pids(srv).values()) - {victim}, 60, "a new worker")
            load.wait_ok(10)
            own = [n for n in segments_of(srv.pid) if f"/dev/shm/{n}" not in squats]
            assert len(own) == 3 and all(len(n.split("_")) == 5 for n in own), own
            for path in squats:
                with open(path, "rb") as f:
                    assert f.read() == b"taken", path  # never opened, cut or removed
            for path in squats:  # ours to remove: the stop checks nothing of the server's is left
                os.unlink(path)
        assert load.failed() == 0, (load.outcomes, load.errors[:5])
    finally:
        for path in squats:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)


# -- a worker that lies ----------------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["record", "label"])
def test_a_worker_that_lies_is_replaced_within_a_second_and_nothing_is_lost(
    tmp_path: Path, default_model: str, sst2_texts: list[str], kind: str
) -> None:
    # Test-only hook: worker serial 1 (slot 0) writes a malformed answer after 300 honest ones.
    env = {"RINGSERVE_TEST_LYING_WORKER": f"{kind}:300"}
    args = ["--workers", "2", "--spares", "1"]
    with serving(ServerProc(tmp_path, args, env), 2) as srv:
        wait_for(lambda: any(w["state"] == "spare" for w in srv.status()["workers"]), 120, "spare")
        liar = ready_pids(srv)[0]
        with Load(srv.port, sst2_texts, clients=6, batch=4) as load:
            wait_for(lambda: events(srv, "worker_died"), 120, "the liar's death")
            died = events(srv, "worker_died")[0]
            assert died["pid"] == liar and died["worker"] == 0, died
            assert died["reason"].startswith("malformed answer"), died
            assert died["rerouted"] >= 1, died  # it held the text it lied about, at least
            wait_for(lambda: 0 in ready_pids(srv) and ready_pids(srv)[0] != liar, 10, "slot 0")
            # Slot 0 is filled by a spawn at start, by a promotion only once its worker is gone:
            # the warm spare took it in the same pass that declared the liar dead.
            (taken,) = [e for e in events(srv, "worker_promoted") if e["worker"] == 0]
            assert abs(taken["ts"] - died["ts"]) < 1.0, (died, taken)
            wait_for(lambda: not psutil.pid_exists(liar), 10, "the liar killed")
            load.wait_ok(30)
        assert load.failed() == 0, (load.outcomes, load.errors[:5])
        assert srv.proc.poll() is None


# -- a reload onto an artifact that verifies but does not load -------------------------------------
def break_artifact(artifact: Path) -> None:
    """Its model files replaced by junk and its fingerprint made to match them: it verifies,
    but no worker can load it."""
    from ringserve.workers.artifact import compute_fingerprint

    for model_file in artifact.glob("model*"):
        model_file.unlink()
        model_file.write_bytes(b"not a model")
    manifest = json.loads((artifact / "manifest.json").read_text())
    manifest["fingerprint"] = compute_fingerprint(artifact)
    (artifact / "manifest.json").write_text(json.dumps(manifest))


def linked_copy(source: str | Path, target: Path) -> None:
    """The artifact's files linked (large, never written here), its manifest copied."""
    target.mkdir(parents=True)
    for f in Path(source).iterdir():
        if f.name == "manifest.json":
            (target / f.name).write_bytes(f.read_bytes())
        else:
            os.symlink(f.resolve(), target / f.name)


def test_a_reload_onto_an_unloadable_artifact_keeps_the_old_model_serving(
    tmp_path: Path, default_model: str, sst2_texts: list[str]
) -> None:
    repo = tmp_path / "repo"
    linked_copy(default_model, repo / "alpha")
    args = ["--model-repository", str(repo), "--model-control", "explicit", "--model", "alpha"]
    args += ["--workers", "1", "--spares", "0"]
    with serving(ServerProc(tmp_path, args), 1) as srv:
        fingerprint = srv.status()["models"][0]["fingerprint"]
        (old,) = ready_pids(srv).values()
        with Load(srv.port, sst2_texts, clients=4, model="alpha") as load:
            load.wait_ok(10)
            saved = tmp_path / "saved"
            shutil.copytree(repo / "alpha", saved, symlinks=True)
            break_artifact(repo / "alpha")
            reply = srv.ctl({"cmd": "reload"}, timeout=300)  # 1: ctl reload
            assert not reply["ok"] and "keep serving" in reply["error"], reply
            assert "could not load" in reply["error"], reply
            load.wait_ok(10)
            status, _, body = srv.request(  # 2: the repository's load call
                "POST", "/v2/repository/models/alpha/load", {}, timeout=300
            )
            assert status == 500 and b"keep serving" in body, (status, body)
            load.wait_ok(10)
            srv.proc.send_signal(signal.SIGHUP)  # 3: SIGHUP, logged
            wait_for(lambda: len(events(srv, "reload_rolled_back")) == 2, 300, "the SIGHUP's")
            load.wait_ok(10)
            assert ready_pids(srv) == {0: old}, "the old worker serves on, never replaced"
            assert srv.status()["models"][0]["fingerprint"] == fingerprint
            assert srv.proc.poll() is None
            shutil.rmtree(repo / "alpha")  # the artifact put right: a reload takes it
            shutil.copytree(saved, repo / "alpha", symlinks=True)
            assert srv.ctl({"cmd": "reload"}, timeout=300)["ok"]
            wait_for(lambda: set(ready_pids(srv).values()) - {old}, 60, "the reloaded worker")
            load.wait_ok(10)
        assert load.failed() == 0, (load.outcomes, load.errors[:5])
    backs = events(srv, "roll_back")
    assert len(backs) == 3 and all(e["kept"] == 1 for e in backs), backs


def test_the_private_dev_shm_is_private(tmp_path: Path) -> None:
    """What the /dev/shm test relies on: the tmpfs is the wrapped process's alone."""
    if shutil.which("unshare") is None or os.geteuid() != 0:
        pytest.skip("needs root and unshare(1)")
    mount = f'mount -t tmpfs -o size={TMPFS_MIB}m tmpfs /dev/shm && exec "$@"'
    probe = "touch /dev/shm/rs-private-probe && df -m --output=size /dev/shm | tail -1"
    out = subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "sh", "-c", mount, "sh",
         "sh", "-c", probe],
        capture_output=True, text=True, timeout=30, check=True,
    )  # fmt: skip
    assert out.stdout.split() == [str(TMPFS_MIB)]
    assert not os.path.exists("/dev/shm/rs-private-probe")
