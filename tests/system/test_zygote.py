"""Workers forked from the zygote: fast replacement, equal scores, a dead zygote survived, and
nothing left in /dev/shm by a server that exits, or is killed, however it ends."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import psutil

from devkit.load import Load
from devkit.server import ServerProc, segments_of, wait_for


def events(srv: ServerProc, name: str) -> list[dict]:
    out = []
    for line in srv.logs().splitlines():
        if f'"event": "{name}"' in line:
            out.append(json.loads(line))
    return out


def serving(srv: ServerProc) -> dict[int, int]:
    return {
        w["id"]: w["pid"]
        for w in srv.status()["workers"]
        if w["state"] in ("ready", "degraded") and w["id"] >= 0
    }


def whole_again(srv: ServerProc, n: int, gone: set[int]) -> bool:
    pids = serving(srv)
    return len(pids) == n and not gone & set(pids.values())


def tree(pid: int) -> list[int]:
    try:
        return [pid] + [p.pid for p in psutil.Process(pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def named_semaphores(pids: list[int]) -> set[str]:
    """POSIX named semaphores (/dev/shm/sem.*) that any of these processes maps or holds open."""
    found: set[str] = set()
    for pid in pids:
        try:
            with open(f"/proc/{pid}/maps", encoding="utf-8", errors="replace") as f:
                found |= {ln.split()[-1] for ln in f if "/dev/shm/sem." in ln}
            for fd in os.listdir(f"/proc/{pid}/fd"):
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
                if target.startswith("/dev/shm/sem."):
                    found.add(target)
        except OSError:
            continue  # exited meanwhile
    return found


def gone(pids: list[int]) -> bool:
    return not any(psutil.pid_exists(p) and psutil.Process(p).status() != "zombie" for p in pids)


def test_spares_0_sigkill_under_load_whole_within_1_5_s(start_server, sst2_texts) -> None:
    srv = start_server("--workers", "2", "--spares", "0", workers=2)
    wait_for(lambda: events(srv, "zygote_ready"), 60, "zygote ready")
    with Load(srv.port, sst2_texts, clients=6) as load:
        load.wait_ok(30)
        victim = serving(srv)[0]
        killed_at = time.monotonic()
        os.kill(victim, signal.SIGKILL)
        wait_for(lambda: whole_again(srv, 2, {victim}), 1.5, "pool whole within 1.5 s", 0.01)
        elapsed = time.monotonic() - killed_at
        load.wait_ok(30)
    assert load.failed() == 0, (load.outcomes, load.errors[:5])
    assert events(srv, "worker_started")[-1]["how"] == "fork"
    print(f"--spares 0: pool whole {elapsed:.3f} s after SIGKILL")


def test_dead_zygote_is_replaced_and_forked_equals_spawned(start_server, sst2_texts) -> None:
    srv = start_server("--workers", "1", "--spares", "0", workers=1)
    wait_for(lambda: events(srv, "zygote_ready"), 60, "zygote ready")
    assert [e["how"] for e in events(srv, "worker_started")] == ["fork"]
    texts = sst2_texts[:24]
    forked = srv.classify(texts)["results"]

    zygote = events(srv, "zygote_started")[-1]["pid"]
    os.kill(zygote, signal.SIGKILL)
    wait_for(lambda: events(srv, "zygote_replaced"), 10, "dead zygote noticed")
    victim = serving(srv)[0]
    os.kill(victim, signal.SIGKILL)  # replaced by spawn while the new zygote boots
    wait_for(lambda: whole_again(srv, 1, {victim}), 120, "worker replaced without a zygote")
    assert events(srv, "worker_started")[-1]["how"] == "spawn"
    spawned = srv.classify(texts)["results"]

    wait_for(lambda: len(events(srv, "zygote_ready")) == 2, 120, "new zygote ready")
    victim = serving(srv)[0]
    os.kill(victim, signal.SIGKILL)
    wait_for(lambda: whole_again(srv, 1, {victim}), 30, "worker forked again")
    assert events(srv, "worker_started")[-1]["how"] == "fork"
    again = srv.classify(texts)["results"]

    for a, b, c in zip(forked, spawned, again, strict=True):
        assert a["label_id"] == b["label_id"] == c["label_id"]
        worst = max(abs(x - y) for x, y in zip(a["scores"], b["scores"], strict=True))
        assert worst <= 1e-6, (a, b)
        assert a["scores"] == c["scores"]

    # A reload builds a new zygote for the artifact, and the reloaded workers fork from it.
    before = set(serving(srv).values())
    assert srv.ctl({"cmd": "reload"}, timeout=180)["ok"]  # answered once the roll ended
    wait_for(lambda: whole_again(srv, 1, before), 120, "worker reloaded")
    assert [e["reason"] for e in events(srv, "zygote_replaced")] == ["died", "reload"]
    wait_for(lambda: len(events(srv, "zygote_ready")) == 3, 30, "the reload's zygote ready")
    assert events(srv, "worker_started")[-1]["how"] == "fork"


def test_clean_exit_leaves_nothing_and_no_named_semaphore_exists(start_server) -> None:
    srv = start_server("--workers", "1", "--spares", "1", workers=1)
    srv.wait_spares(1)
    pids = tree(srv.pid)
    assert len(pids) >= 4  # front-end, resource tracker, zygote, worker, spare
    assert not named_semaphores(pids)
    assert srv.stop() == 0  # stop() also checks that no rs_<pid>_ segment and no child is left
    wait_for(lambda: gone(pids), 10, "every process of the server gone")
    assert not segments_of(srv.pid)


def test_killed_servers_leave_nothing_after_the_next_start(start_server, tmp_path: Path) -> None:
    """SIGKILL of the front-end alone, and of every process of a server at once (its whole
    process group: stopped first so that none can clean up), then one new server starts."""
    alone = start_server("--workers", "1", "--spares", "0", workers=1)
    group = start_server("--workers", "1", "--spares", "0", workers=1)
    pids_alone, pids_group = tree(alone.pid), tree(group.pid)
    assert segments_of(alone.pid) and segments_of(group.pid)  # there is something to clean
    assert not named_semaphores(pids_alone + pids_group)
    os.kill(alone.pid, signal.SIGKILL)
    for pid in pids_group:
        os.kill(pid, signal.SIGSTOP)
    for pid in pids_group:
        os.kill(pid, signal.SIGKILL)
    for srv in (alone, group):
        srv.proc.wait(10)
        srv.log.close()
    wait_for(lambda: gone(pids_alone + pids_group), 10, "every process of both servers gone")
    nxt = start_server("--workers", "1", "--spares", "0", workers=1)
    for dead in (alone.pid, group.pid):
        assert not segments_of(dead)
    assert not named_semaphores(tree(nxt.pid))
