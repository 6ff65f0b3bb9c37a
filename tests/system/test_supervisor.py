"""The supervisor with real processes and real signals: no request lost, the pool made whole."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import psutil
import pytest
from ringserve.shm.segment import Segment

from devkit.launcher import ROOT
from devkit.load import Load
from devkit.server import ServerProc, segments_of, wait_for
from devkit.server import serving as module_server


def serving(srv: ServerProc) -> dict[int, int]:
    """Slot id -> pid of the ready (or degraded) serving workers."""
    return {
        w["id"]: w["pid"]
        for w in srv.status()["workers"]
        if w["state"] in ("ready", "degraded") and w["id"] >= 0
    }


def pool_with_spare(start_server, *extra: str) -> ServerProc:
    """Two serving workers and a warm spare, all loaded: the set-up every failure test needs."""
    srv: ServerProc = start_server("--workers", "2", "--spares", "1", *extra, workers=2)
    srv.wait_spares(1)
    return srv


@pytest.fixture(scope="module")
def pool(tmp_path_factory: pytest.TempPathFactory, default_model: str) -> Iterator[ServerProc]:
    """pool_with_spare's layout with the heartbeat checked after 1 s, one server for the tests
    that kill or hang workers and check the pool is made whole again (what one test kills is
    replaced before the next begins: `whole_with_spare`) and for the control-socket tests; it
    must still exit 0 with nothing left behind when the module ends."""
    args = ["--workers", "2", "--spares", "1", "--heartbeat-timeout-s", "1"]
    with module_server(ServerProc(tmp_path_factory.mktemp("pool"), args), 2) as srv:
        yield srv


def whole_with_spare(srv: ServerProc) -> ServerProc:
    """`srv` with its two serving workers and a warm spare, as a test of the pool starts."""
    wait_for(lambda: len(serving(srv)) == 2, 60.0, "two serving workers")
    srv.wait_spares(1)
    return srv


def whole_again(srv: ServerProc, n: int, gone: set[int]) -> bool:
    pids = serving(srv)
    return len(pids) == n and not gone & set(pids.values())


def restarts_of(srv: ServerProc, slot: int) -> int:
    return int(next(w for w in srv.status()["workers"] if w["id"] == slot)["restarts"])


def test_sigkill_under_load_loses_nothing(pool: ServerProc, sst2_texts) -> None:
    srv = whole_with_spare(pool)
    restarts = restarts_of(srv, 0)
    with Load(srv.port, sst2_texts, clients=6) as load:
        load.wait_ok(30)
        victim = serving(srv)[0]
        killed_at = time.monotonic()
        os.kill(victim, signal.SIGKILL)
        wait_for(lambda: whole_again(srv, 2, {victim}), 2.0, "pool whole within 2 s")
        elapsed = time.monotonic() - killed_at
        load.wait_ok(30)
    assert load.failed() == 0, (load.outcomes, load.errors[:5])
    status = srv.status()
    slot0 = next(w for w in status["workers"] if w["id"] == 0)
    assert slot0["restarts"] == restarts + 1 and slot0["pid"] != victim
    assert status["restarts_total"] >= 1
    print(f"pool whole {elapsed:.3f}s after SIGKILL")


def lanes_pinned(pid: int, cpus: list[int]) -> bool:
    """Each of `cpus` has a thread of the worker pinned to it alone (a lane each)."""
    try:
        masks = [os.sched_getaffinity(int(t)) for t in os.listdir(f"/proc/{pid}/task")]
    except OSError:
        return False
    return sorted(next(iter(m)) for m in masks if len(m) == 1) == sorted(cpus)


def two_cores() -> list[int]:
    """This machine's 2 cores, which the default layout pairs into one worker of 2 lanes (the
    test is skipped on any other count)."""
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) != 2:
        pytest.skip("the default pairs 2 cores into one worker of 2 lanes; this machine has "
                    f"{len(cores)}")  # fmt: skip
    return cores


def test_default_layout_is_a_worker_of_two_lanes_and_a_sigkill_loses_nothing(
    start_server, sst2_texts
) -> None:
    """With no --workers on 2 cores, one worker of 2 lanes holds both cores; killed under load
    it is replaced by the spare, whose lanes pin themselves to the slot's cores, and no request
    fails."""
    cores = two_cores()
    srv: ServerProc = start_server("--spares", "1", workers=1)
    srv.wait_spares(1)
    [worker] = [w for w in srv.status()["workers"] if w["id"] >= 0]
    assert (worker["lanes"], worker["cpus"]) == (2, cores)
    assert '"lanes": 2, "workers": 1' in srv.logs()
    wait_for(lambda: lanes_pinned(worker["pid"], cores), 10.0, "each lane on its own core")
    with Load(srv.port, sst2_texts, clients=32) as load:
        load.wait_ok(30)
        victim = worker["pid"]
        os.kill(victim, signal.SIGKILL)
        wait_for(lambda: whole_again(srv, 1, {victim}), 2.0, "pool whole within 2 s")
        load.wait_ok(30)
    assert load.failed() == 0, (load.outcomes, load.errors[:5])
    [after] = [w for w in srv.status()["workers"] if w["id"] == 0]
    assert after["restarts"] == 1 and after["lanes"] == 2 and after["cpus"] == cores
    wait_for(lambda: lanes_pinned(after["pid"], cores), 10.0, "the new worker's lanes pinned")


def test_lanes_without_a_spare_survive_a_hang_then_a_sigkill_right_after_readiness(
    start_server, sst2_texts
) -> None:
    """The default layout with no spare: a worker of 2 lanes stopped under load is found hung
    and replaced by a fork from the zygote; that replacement, killed as soon as it is ready, is
    replaced again. Each new worker has its 2 lanes pinned, and no request fails: what a worker
    held is re-sent, what waits meanwhile waits in the front-end."""
    cores = two_cores()
    srv: ServerProc = start_server("--spares", "0", "--heartbeat-timeout-s", "1", workers=1)
    [first] = [w for w in srv.status()["workers"] if w["id"] >= 0]
    assert (first["lanes"], first["cpus"]) == (2, cores)
    with Load(srv.port, sst2_texts, clients=8) as load:
        load.wait_ok(30)
        os.kill(first["pid"], signal.SIGSTOP)
        try:
            wait_for(lambda: whole_again(srv, 1, {first["pid"]}), 20.0, "hung worker replaced")
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.kill(first["pid"], signal.SIGCONT)
        second = serving(srv)[0]
        os.kill(second, signal.SIGKILL)  # at once: it has just become ready
        wait_for(lambda: whole_again(srv, 1, {first["pid"], second}), 20.0, "killed replaced")
        load.wait_ok(30)
    assert load.failed() == 0, (load.outcomes, load.errors[:5])
    [after] = [w for w in srv.status()["workers"] if w["id"] == 0]
    assert after["restarts"] == 2 and after["lanes"] == 2 and after["cpus"] == cores
    wait_for(lambda: lanes_pinned(after["pid"], cores), 10.0, "the third worker's lanes pinned")
    assert "heartbeat stale" in srv.logs()


def test_sigstop_hang_is_detected_and_replaced(pool: ServerProc, sst2_texts) -> None:
    srv = whole_with_spare(pool)
    logged_before = len(srv.logs())
    with Load(srv.port, sst2_texts, clients=6) as load:
        load.wait_ok(30)
        victim = serving(srv)[1]
        os.kill(victim, signal.SIGSTOP)
        try:
            wait_for(lambda: whole_again(srv, 2, {victim}), 15.0, "hung worker replaced")
            wait_for(
                lambda: (
                    not psutil.pid_exists(victim)
                    or psutil.Process(victim).status() == psutil.STATUS_ZOMBIE
                ),
                10.0,
                "hung worker killed",
            )
        finally:
            if psutil.pid_exists(victim):
                os.kill(victim, signal.SIGCONT)
        load.wait_ok(30)
    assert load.failed() == 0, (load.outcomes, load.errors[:5])
    assert "heartbeat stale" in srv.logs()[logged_before:]


def test_every_worker_killed_at_once(pool: ServerProc, sst2_texts) -> None:
    srv = whole_with_spare(pool)
    with Load(srv.port, sst2_texts, clients=6) as load:
        load.wait_ok(30)
        victims = {w["pid"] for w in srv.status()["workers"]}
        for pid in victims:
            os.kill(pid, signal.SIGKILL)
        wait_for(lambda: whole_again(srv, 2, victims), 60.0, "pool rebuilt from nothing")
        load.wait_ok(30)
    assert load.failed() == 0, (load.outcomes, load.errors[:5])


def test_sigterm_under_load_finishes_inflight(start_server, sst2_texts) -> None:
    srv = start_server("--workers", "1", "--spares", "0", "--heartbeat-timeout-s", "60", workers=1)
    texts = [" ".join(sst2_texts[i : i + 12]) for i in range(0, 12 * 40, 12)]

    def post(batch: list[str]) -> int:
        status, _, body = srv.request("POST", "/v1/classify", {"texts": batch}, timeout=120)
        assert status == 200 or status == 503, (status, body)
        return status

    (worker,) = srv.worker_pids().values()
    # Held still until the drain has begun, so that the 40 texts are all in flight when SIGTERM
    # arrives however fast the model is; the server's own count at the drain says so.
    os.kill(worker, signal.SIGSTOP)
    try:
        with ThreadPoolExecutor(8) as pool:
            futures = [pool.submit(post, texts[i : i + 5]) for i in range(0, 40, 5)]
            wait_for(lambda: srv.status()["queue_depth"] == 40, 30, "all 40 texts in flight")
            srv.proc.send_signal(signal.SIGTERM)
            drain = wait_for(lambda: logged(srv, "drain"), 30, "the drain")
            assert drain["inflight"] == 40, drain
            os.kill(worker, signal.SIGCONT)
            codes = [f.result() for f in futures]
    finally:
        with contextlib.suppress(ProcessLookupError):  # gone already once the drain ends
            os.kill(worker, signal.SIGCONT)
    assert codes == [200] * len(codes)
    assert srv.proc.wait(60) == 0
    assert srv.stop() == 0


def logged(srv: ServerProc, event: str) -> dict[str, Any] | None:
    """The first log record of this event, if the server has written one."""
    records = [json.loads(x) for x in srv.logs().splitlines() if x.startswith("{")]
    return next((r for r in records if r["event"] == event), None)


def events(srv: ServerProc) -> list[str]:
    return [json.loads(x)["event"] for x in srv.logs().splitlines() if x.startswith("{")]


def test_second_stop_signal_stops_at_once_and_still_cleans_up(start_server) -> None:
    srv = start_server("--workers", "1", "--spares", "0", "--drain-timeout-s", "600", workers=1)
    with socket.create_connection(("127.0.0.1", srv.port), timeout=30) as idle:
        idle.sendall(b"GET /v1/model HTTP/1.1\r\n\r\n")
        assert idle.recv(65536).startswith(b"HTTP/1.1 200 ")  # open: the drain waits for it
        srv.proc.send_signal(signal.SIGTERM)
        wait_for(lambda: "drain" in events(srv), 30, "the drain")
        assert srv.proc.poll() is None  # the first signal would wait up to 600 s
        srv.proc.send_signal(signal.SIGINT)  # a second Ctrl-C
        assert srv.proc.wait(60) == 0
    assert "stop_now" in events(srv)
    assert not os.path.exists(srv.control)
    assert srv.stop() == 0  # and no worker process or shared-memory segment left behind


def test_drain_timeout_answers_what_is_still_owed_and_exits(start_server) -> None:
    """The drain's deadline: a request its worker never answers gets 500 at the deadline (not a
    hang, not a lost answer), the server says so in its log, and still exits 0 and cleans up."""
    srv = start_server(
        "--workers", "1", "--spares", "0", "--drain-timeout-s", "1", "--heartbeat-timeout-s", "600",
        workers=1,
    )  # fmt: skip
    worker = serving(srv)[0]
    os.kill(worker, signal.SIGSTOP)  # holds the request in its ring; no heartbeat check for 600 s
    try:
        with ThreadPoolExecutor(1) as pool:
            owed = pool.submit(srv.request, "POST", "/v1/classify", {"text": "held"})
            wait_for(lambda: srv.status()["queue_depth"] == 1, 30, "the request in flight")
            srv.proc.send_signal(signal.SIGTERM)
            status, _, body = owed.result(timeout=60)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(worker, signal.SIGCONT)
    assert status == 500, (status, body)
    assert srv.proc.wait(60) == 0
    timeout_record = logged(srv, "drain_timeout")
    assert timeout_record is not None and timeout_record["unanswered"] == 1
    assert srv.stop() == 0  # and no worker process or shared-memory segment left behind


def test_killed_frontend_takes_its_workers_and_next_server_cleans(
    start_server, tmp_path: Path
) -> None:
    srv = start_server("--workers", "1", "--spares", "1", workers=1)
    srv.wait_spares(1)
    kids = [p.pid for p in srv.children()]
    workers = [w["pid"] for w in srv.status()["workers"]]
    assert set(workers) <= set(kids)
    dead_pid = srv.pid
    os.kill(dead_pid, signal.SIGKILL)
    srv.proc.wait(10)
    srv.log.close()
    wait_for(
        lambda: (
            not any(
                psutil.pid_exists(p) and psutil.Process(p).status() != "zombie" for p in workers
            )
        ),
        5.0,
        "orphaned workers to exit",
    )
    # Whatever the dead server left, plus a segment we plant in its name, must go.
    planted = Segment.create(f"rs_{dead_pid}_999_req", 4096)
    planted.close()
    nxt = start_server("--workers", "1", "--spares", "0", workers=1)
    assert not segments_of(dead_pid)
    assert "stale_segments_removed" in nxt.logs()


def test_reload_and_scale_under_load_lose_nothing(start_server, sst2_texts) -> None:
    srv = pool_with_spare(start_server)
    with Load(srv.port, sst2_texts, clients=6) as load:
        load.wait_ok(20)
        before = set(serving(srv).values())
        with socket.socket(socket.AF_UNIX) as ctl:  # answered in order, the reload's first
            ctl.settimeout(180)  # once its roll has ended
            ctl.connect(srv.control)
            ctl.sendall(b'{"cmd": "reload"}\n{"cmd": "status"}\n')
            lines = b""
            while lines.count(b"\n") < 2:
                lines += ctl.recv(65536)
        reload, status = (json.loads(x) for x in lines.splitlines())
        assert reload["ok"] and "generation" in reload and "workers" in status
        wait_for(lambda: whole_again(srv, 2, before), 90.0, "every worker reloaded")
        load.wait_ok(20)
        assert srv.ctl({"cmd": "scale", "workers": 3})["ok"]
        wait_for(lambda: len(serving(srv)) == 3, 90.0, "scaled to 3")
        load.wait_ok(20)
        assert srv.ctl({"cmd": "scale", "workers": 1})["ok"]
        wait_for(
            lambda: (
                len(serving(srv)) == 1
                and all(w["state"] != "draining" for w in srv.status()["workers"])
            ),
            60.0,
            "scaled to 1",
        )
        load.wait_ok(20)
        old = serving(srv)[0]
        assert srv.ctl({"cmd": "restart", "worker": 0})["ok"]
        wait_for(lambda: whole_again(srv, 1, {old}), 60.0, "worker 0 restarted")
        load.wait_ok(20)
    assert load.failed() == 0, (load.outcomes, load.errors[:5])
    before = set(serving(srv).values())  # read before the signal: it may act at once
    srv.proc.send_signal(signal.SIGHUP)  # SIGHUP is the same reload
    wait_for(lambda: whole_again(srv, 1, before), 90.0, "SIGHUP reload")


def test_leaking_worker_is_recycled(start_server, sst2_texts) -> None:
    # Test-only hook (off unless this variable is set): each batch leaks 8 MiB in the worker.
    env = {"RINGSERVE_TEST_GROW_BYTES_PER_BATCH": str(8 << 20)}
    srv = start_server(
        "--workers", "1", "--spares", "1", "--worker-max-rss", str(900 << 20), env=env, workers=1
    )
    srv.wait_spares(1)
    first = serving(srv)[0]
    with Load(srv.port, sst2_texts, clients=4) as load:
        wait_for(
            lambda: first not in serving(srv).values() and len(serving(srv)) == 1,
            120.0,
            "leaking worker recycled",
        )
        load.wait_ok(10)
    assert load.failed() == 0, (load.outcomes, load.errors[:5])
    assert "rss limit" in srv.logs()
    slot0 = next(w for w in srv.status()["workers"] if w["id"] == 0)
    assert slot0["restarts"] >= 1


def test_boot_failure_stops_the_server_clearly(tmp_path: Path, default_model: str) -> None:
    from ringserve.workers.artifact import compute_fingerprint

    broken = tmp_path / "broken"
    shutil.copytree(default_model, broken)
    for model_file in broken.glob("model*"):  # whichever runtime the worker picks
        model_file.write_bytes(b"not a model")
    manifest = json.loads((broken / "manifest.json").read_text())
    manifest["fingerprint"] = compute_fingerprint(broken)  # consistent, but unloadable
    (broken / "manifest.json").write_text(json.dumps(manifest))
    args = ["--model", str(broken), "--workers", "1", "--spares", "0"]
    srv = ServerProc(tmp_path, args)  # the default runtime, whichever model file it loads
    assert srv.wait_exit(120) == 1
    log = srv.logs()
    assert "could not load the model" in log
    assert log.count('"worker_started"') <= 2  # no crash loop


def test_fingerprint_mismatch_refuses_to_start(tmp_path: Path, default_model: str) -> None:
    bad = tmp_path / "bad"
    shutil.copytree(default_model, bad)
    manifest = json.loads((bad / "manifest.json").read_text())
    manifest["labels"] = ["neg", "pos"]  # edited after export: hashes no longer match
    (bad / "manifest.json").write_text(json.dumps(manifest))
    srv = ServerProc(tmp_path, ["--model", str(bad)])
    assert srv.wait_exit(60) != 0
    assert "fingerprint mismatch" in srv.logs()


def test_a_port_in_use_is_said_in_a_line_and_leaves_nothing(tmp_path: Path) -> None:
    """A taken port fails the start at once with one line naming the listener and the address
    (it was a traceback), and the control socket made before it is removed."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        srv = ServerProc(tmp_path, ["--port", str(port)])
        assert srv.wait_exit(60) == 1
    logs = srv.logs()
    assert f"ringserve: cannot listen for http on 127.0.0.1:{port}: " in logs, logs[-2000:]
    assert "address already in use" in logs and "Traceback" not in logs, logs[-2000:]
    assert not Path(srv.control).exists()


@pytest.mark.parametrize(
    "cmd",
    [
        {"cmd": "nope"},
        {"cmd": "restart", "worker": "x"},
        {"cmd": "scale", "workers": 0},
        {"nocmd": 1},
    ],
)
def test_control_rejects_bad_commands(pool: ServerProc, cmd: dict) -> None:
    reply = pool.ctl(cmd)
    assert reply["ok"] is False and reply["error"]
    assert pool.status()["ok"] is True


def test_control_socket_mode_and_ctl_command(pool: ServerProc) -> None:
    assert oct(os.stat(pool.control).st_mode & 0o777) == "0o600"
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "ringserve.service.cli",
            "ctl",
            "--control",
            pool.control,
            "status",
        ],
        capture_output=True,
        text=True,
        timeout=30,
        cwd=ROOT,
    )
    assert out.returncode == 0
    doc = json.loads(out.stdout)
    assert doc["ok"] and {
        "uptime_s",
        "queue_depth",
        "draining",
        "restarts_total",
        "model",
        "workers",
    } <= set(doc)
    w = doc["workers"][0]
    assert {
        "id",
        "pid",
        "state",
        "device",
        "cpus",
        "rss_bytes",
        "inflight",
        "restarts",
        "heartbeat_age_ms",
    } <= set(w)
    bad = subprocess.run(
        [
            sys.executable,
            "-m",
            "ringserve.service.cli",
            "ctl",
            "--control",
            pool.control,
            "restart",
            "99",
        ],
        capture_output=True,
        text=True,
        timeout=30,
        cwd=ROOT,
    )
    assert bad.returncode == 1
