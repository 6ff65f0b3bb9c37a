"""Several ringserve nodes on one machine behind HAProxy, and what each failure costs the clients.

Each node is a server in a network namespace of its own, joined to a hub namespace by a veth pair
and a bridge. The hub holds HAProxy (Debian's package; leastconn, active health checks on
/v2/health/ready, retries on connection failure, empty response, timeout and 503) and the
clients: keep-alive HTTP clients, one that opens a connection per request, and a binary-protocol
client, offered together about 40% of one node's measured capacity. Scenarios, with pass marks:

  SIGTERM one node            0 failed, node marked down within 1.5 s, exit 0, no segments left
  SIGKILL one front-end       0 failed, max latency 2 s
  link down, then up          0 failed
  rolling restart             0 failed
  --reuse-port upgrade x N    0 failed, 0 connection resets, P99 <= 1 s (clients on the node)

Run as root: `python -m benchmarks.cluster [--nodes 3] [--short]`. Every namespace, link and
process it makes is removed (processes by PID); traffic goes only to its own namespaces, on the
private range 10.231.7.0/24 that exists only inside them. The binary client re-sends the frames
a closed connection left unanswered on a new connection (HAProxy cannot retry inside a TCP
stream); those re-sends are counted and printed, and only a frame never answered is a failure.
Waits poll: traffic flows when every client has had an answer, and a scenario's window ends
when every request begun in it is answered; the link-down is the one fixed wait.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ringserve.wire import frames as wire

from devkit.launcher import DATA, ROOT
from devkit.load import percentile

SUBNET = "10.231.7"
HUB_IP = f"{SUBNET}.1"
HTTP_PORT, BINARY_PORT = 8000, 8001


def sh(*cmd: str) -> None:
    subprocess.run(cmd, check=True, capture_output=True, timeout=30)


def node_ip(i: int) -> str:
    return f"{SUBNET}.{11 + i}"


# -- the network: made and removed by the outer process -------------------------------------------
class Network:
    def __init__(self, nodes: int) -> None:
        tag = f"rsc{os.getpid()}"
        self.hub = f"{tag}hub"
        self.nodes = [f"{tag}n{i}" for i in range(nodes)]
        self.made: list[str] = []

    def up(self) -> None:
        sh("ip", "netns", "add", self.hub)
        self.made.append(self.hub)
        sh("ip", "-n", self.hub, "link", "set", "lo", "up")
        sh("ip", "-n", self.hub, "link", "add", "br0", "type", "bridge")
        sh("ip", "-n", self.hub, "addr", "add", f"{HUB_IP}/24", "dev", "br0")
        sh("ip", "-n", self.hub, "link", "set", "br0", "up")
        for i, ns in enumerate(self.nodes):
            sh("ip", "netns", "add", ns)
            self.made.append(ns)
            sh("ip", "-n", ns, "link", "set", "lo", "up")
            # Both ends are created inside our namespaces: nothing appears in the host's.
            sh("ip", "link", "add", "name", f"v{i}", "netns", self.hub, "type", "veth",
               "peer", "name", "eth0", "netns", ns)  # fmt: skip
            sh("ip", "-n", self.hub, "link", "set", f"v{i}", "master", "br0", "up")
            sh("ip", "-n", ns, "addr", "add", f"{node_ip(i)}/24", "dev", "eth0")
            sh("ip", "-n", ns, "link", "set", "eth0", "up")

    def down(self) -> None:
        for ns in reversed(self.made):  # deleting a namespace deletes its links
            subprocess.run(["ip", "netns", "delete", ns], capture_output=True, timeout=30)
        self.made.clear()


# -- nodes and HAProxy: started and stopped (by PID) by the inner process, in the hub --------------
class Node:
    def __init__(self, i: int, ns: str, tmp: Path, extra: list[str]) -> None:
        self.i, self.ns, self.tmp, self.extra = i, ns, tmp, extra
        self.control = str(tmp / f"n{i}.sock")
        self.procs: list[subprocess.Popen[bytes]] = []

    def start(self) -> subprocess.Popen[bytes]:
        log = open(self.tmp / f"n{self.i}-{len(self.procs)}.log", "wb")  # noqa: SIM115 - kept by the child
        args = [
            "ip", "netns", "exec", self.ns, sys.executable, "-m", "ringserve.service.cli", "serve",
            "--host", node_ip(self.i), "--port", str(HTTP_PORT),
            "--binary-port", str(BINARY_PORT), "--control", self.control,
            "--workers", "1", "--spares", "0", "--reuse-port",
            "--shutdown-delay-s", "1", "--drain-timeout-s", "4", *self.extra,
        ]  # fmt: skip
        # `ip netns exec` execs the server: the PID we hold is the server's own.
        proc = subprocess.Popen(args, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
        log.close()
        self.procs.append(proc)
        return proc

    def listening(self, proc: subprocess.Popen[bytes]) -> bool:
        if proc.poll() is not None:
            raise RuntimeError(f"node {self.i} exited {proc.returncode}")
        log = self.tmp / f"n{self.i}-{self.procs.index(proc)}.log"
        return '"event": "start"' in log.read_text(errors="replace")

    def wait_listening(self, proc: subprocess.Popen[bytes], timeout: float = 180) -> None:
        deadline = time.monotonic() + timeout
        while not self.listening(proc):
            if time.monotonic() > deadline:
                raise RuntimeError(f"node {self.i} not ready in {timeout} s")
            time.sleep(0.05)

    def alive(self) -> list[subprocess.Popen[bytes]]:
        return [p for p in self.procs if p.poll() is None]

    def kill_all(self) -> None:
        for p in self.alive():
            with_children = child_pids(p.pid)
            p.kill()
            p.wait(30)
            for pid in with_children:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass


def child_pids(pid: int) -> list[int]:
    import psutil

    try:
        return [c.pid for c in psutil.Process(pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def segments_of(pid: int) -> list[str]:
    return [n for n in os.listdir("/dev/shm") if n.startswith(f"rs_{pid}_")]


HAPROXY = """
global
    stats socket {sock} mode 600 level admin
    maxconn 4096
defaults
    timeout connect 500ms
    timeout client 60s
    timeout server 3s
    timeout check 500ms
    retries 3
    option redispatch 1
frontend http
    bind {hub}:{http}
    mode http
    option http-buffer-request
    default_backend nodes
backend nodes
    mode http
    balance leastconn
    option httpchk GET /v2/health/ready
    http-check expect status 200
    retry-on conn-failure empty-response response-timeout 503
    default-server inter 250ms fall 2 rise 2
{http_servers}
frontend binary
    bind {hub}:{binary}
    mode tcp
    default_backend binaries
backend binaries
    mode tcp
    balance leastconn
    option httpchk GET /v2/health/ready
    http-check expect status 200
    default-server inter 250ms fall 2 rise 2 port {http}
{binary_servers}
"""


def start_haproxy(tmp: Path, nodes: int) -> tuple[subprocess.Popen[bytes], str]:
    sock = str(tmp / "haproxy.sock")
    cfg = HAPROXY.format(
        sock=sock, hub=HUB_IP, http=HTTP_PORT, binary=BINARY_PORT,
        http_servers="\n".join(
            f"    server n{i} {node_ip(i)}:{HTTP_PORT} check" for i in range(nodes)),
        binary_servers="\n".join(
            f"    server n{i} {node_ip(i)}:{BINARY_PORT} check" for i in range(nodes)),
    )  # fmt: skip
    (tmp / "haproxy.cfg").write_text(cfg)
    proc = subprocess.Popen(
        ["haproxy", "-db", "-f", str(tmp / "haproxy.cfg")],
        stdout=open(tmp / "haproxy.log", "wb"),  # noqa: SIM115 - kept by the child
        stderr=subprocess.STDOUT,
    )
    deadline = time.monotonic() + 10
    while not os.path.exists(sock):
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError((tmp / "haproxy.log").read_text())
        time.sleep(0.02)
    return proc, sock


def server_states(sock: str) -> dict[str, str]:
    with socket.socket(socket.AF_UNIX) as s:
        s.connect(sock)
        s.sendall(b"show stat\n")
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    rows = data.decode().splitlines()
    head = rows[0].lstrip("# ").split(",")
    out = {}
    for row in rows[1:]:
        f = dict(zip(head, row.split(","), strict=False))
        if f.get("pxname") == "nodes" and f.get("svname", "").startswith("n"):
            out[f["svname"]] = f["status"]
    return out


# -- clients ---------------------------------------------------------------------------------------
class Record:
    """Every request's end time, latency and outcome, shared by all clients."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.rows: list[tuple[float, float, str, str]] = []  # end, latency s, client, outcome
        self.resent: list[tuple[float, str]] = []  # binary frames re-sent: when, why
        self.inflight: dict[str, float] = {}  # client -> when its unanswered request began

    def begin(self, client: str, started: float) -> None:
        with self.lock:
            self.inflight[client] = started

    def add(self, client: str, started: float, outcome: str) -> None:
        now = time.monotonic()
        with self.lock:
            self.inflight.pop(client, None)
            self.rows.append((now, now - started, client, outcome))

    def settled(self, t: float) -> bool:
        """No request that began before `t` is still unanswered."""
        with self.lock:
            return all(started > t for started in self.inflight.values())

    def answered_since(self, t: float, clients: list[str]) -> bool:
        """Every client named has had a request that began after `t` answered ok."""
        with self.lock:
            done = {c for end, lat, c, outcome in self.rows if outcome == "ok" and end - lat > t}
        return done >= set(clients)

    def window(self, t0: float, t1: float) -> dict[str, Any]:
        with self.lock:
            rows = [r for r in self.rows if t0 <= r[0] <= t1]
            resent = Counter(why for when, why in self.resent if t0 <= when <= t1)
        lat = sorted(r[1] for r in rows if r[3] == "ok")
        outcomes = Counter(r[3] for r in rows)
        return {
            "requests": len(rows),
            "failed": len(rows) - outcomes["ok"],
            "outcomes": dict(outcomes),
            "resets": sum(v for k, v in outcomes.items() if "Reset" in k or "reset" in k),
            "p99_ms": round(percentile(lat, 99) * 1000, 1) if lat else None,
            "max_ms": round(lat[-1] * 1000, 1) if lat else None,
            # closed or reset before the answer, then answered: binary frames, and HTTP
            # requests that met their idle keep-alive connection closed by a drain
            "binary_resends": dict(resent),
        }


class Paced(threading.Thread):
    """A client that starts a request every 1/rate s (no catch-up burst when late)."""

    def __init__(self, name: str, rate: float, texts: list[str], rec: Record) -> None:
        super().__init__(daemon=True, name=name)
        self.rate, self.texts, self.rec = rate, texts, rec
        self.stop_event = threading.Event()
        self.i = 0

    def text(self) -> str:
        self.i += 1
        return self.texts[self.i % len(self.texts)]

    def run(self) -> None:
        next_at = time.monotonic()
        while not self.stop_event.is_set():
            delay = next_at - time.monotonic()
            if delay > 0 and self.stop_event.wait(delay):
                break
            next_at = max(next_at + 1 / self.rate, time.monotonic())
            self.once()
        self.close()

    def once(self) -> None:
        raise NotImplementedError

    def close(self) -> None:
        pass


class HttpClient(Paced):
    def __init__(self, name: str, rate: float, texts: list[str], rec: Record,
                 host: str, keep_alive: bool) -> None:  # fmt: skip
        super().__init__(name, rate, texts, rec)
        self.host, self.keep_alive = host, keep_alive
        self.conn: http.client.HTTPConnection | None = None

    def once(self) -> None:
        """One request. Sent on a kept-alive connection that the server had closed (a drain
        closes idle ones at once), it fails before any answer: then it is re-sent once on a new
        connection, as Go's Transport does (errServerClosedIdle), and counted as a re-send."""
        started = time.monotonic()
        self.rec.begin(self.name, started)
        body = json.dumps({"text": self.text()})
        reused = self.conn is not None
        outcome = self.send(body)
        if reused and outcome in KEEPALIVE_RACE:
            with self.rec.lock:
                self.rec.resent.append((time.monotonic(), f"http {outcome}"))
            outcome = self.send(body)
        self.rec.add(self.name, started, outcome)

    def send(self, body: str) -> str:
        try:
            if self.conn is None:
                self.conn = http.client.HTTPConnection(self.host, HTTP_PORT, timeout=30)
            self.conn.request("POST", "/v1/classify", body)
            resp = self.conn.getresponse()
            data = resp.read()
            ok = resp.status == 200 and "label" in json.loads(data)
            outcome = "ok" if ok else f"http{resp.status}"
            if resp.will_close or not self.keep_alive:
                self.close()
        except (OSError, http.client.HTTPException, ValueError) as exc:
            outcome = type(exc).__name__
            self.close()
        return outcome

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()
        self.conn = None


# A request that met its idle keep-alive connection closed by the server: nothing was answered.
KEEPALIVE_RACE = ("BrokenPipeError", "ConnectionResetError", "RemoteDisconnected")


class BinaryClient(Paced):
    """One frame at a time; a closed or stalled connection is replaced and the frame re-sent."""

    def __init__(self, name: str, rate: float, texts: list[str], rec: Record, host: str) -> None:
        super().__init__(name, rate, texts, rec)
        self.host = host
        self.sock: socket.socket | None = None

    def once(self) -> None:
        started = time.monotonic()
        self.rec.begin(self.name, started)
        data = self.text().encode()
        frame = wire.encode_frame(data, self.i)
        outcome = "never answered"
        for attempt in range(5):
            try:
                if self.sock is None:
                    self.sock = socket.create_connection((self.host, BINARY_PORT), timeout=3)
                self.sock.sendall(frame)
                head = recv_exact(self.sock, wire.ANSWER.size)
                tag, status, _, _, n = wire.ANSWER.unpack(head)
                recv_exact(self.sock, 4 * n)
                outcome = "ok" if status == 0 and tag == self.i else f"binary-status{status}"
                break
            except OSError as exc:
                self.close()
                if attempt < 4:
                    with self.rec.lock:
                        self.rec.resent.append((time.monotonic(), type(exc).__name__))
        self.rec.add(self.name, started, outcome)

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close()
        self.sock = None


class ClosedBeforeAnswer(ConnectionError):
    """The server closed the connection (FIN, not a reset) with our frame unanswered."""


def recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = b""
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise ClosedBeforeAnswer("closed before the answer")
        buf += chunk
    return buf


def mixed_clients(host: str, rate: float, texts: list[str], rec: Record, tag: str) -> list[Paced]:
    """Two keep-alive clients, one new-connection-per-request, one binary: `rate` in all."""
    return [
        HttpClient(f"{tag}keepalive0", rate * 0.3, texts, rec, host, True),
        HttpClient(f"{tag}keepalive1", rate * 0.3, texts, rec, host, True),
        HttpClient(f"{tag}newconn", rate * 0.2, texts, rec, host, False),
        BinaryClient(f"{tag}binary", rate * 0.2, texts, rec, host),
    ]


def capacity(host: str, texts: list[str], seconds: float) -> float:
    """Closed loop on one node, 4 keep-alive clients: answers per second."""
    done = Counter[str]()
    stop = time.monotonic() + seconds

    def loop(k: int) -> None:
        conn = http.client.HTTPConnection(host, HTTP_PORT, timeout=30)
        i = k
        while time.monotonic() < stop:
            i += 4
            conn.request("POST", "/v1/classify", json.dumps({"text": texts[i % len(texts)]}))
            r = conn.getresponse()
            r.read()
            done[str(r.status)] += 1
        conn.close()

    threads = [threading.Thread(target=loop, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return done["200"] / seconds


# -- scenarios -------------------------------------------------------------------------------------
class Run:
    """The inner process: nodes, HAProxy and clients in the hub namespace; scenarios in turn."""

    def __init__(self, args: argparse.Namespace, tmp: Path) -> None:
        self.args, self.tmp = args, tmp
        self.nodes = [Node(i, ns, tmp, []) for i, ns in enumerate(args.node_ns)]
        self.current: dict[int, subprocess.Popen[bytes]] = {}
        self.rec = Record()
        self.results: list[dict[str, Any]] = []
        rows = (DATA / "sst2" / "sample.tsv").read_text(encoding="utf-8").splitlines()[1:]
        self.texts = [r.split("\t")[0] for r in rows[:1000]]
        self.haproxy: subprocess.Popen[bytes] | None = None
        self.stats = ""

    def boot(self, i: int) -> None:
        proc = self.nodes[i].start()
        self.nodes[i].wait_listening(proc)
        self.current[i] = proc

    def wait_haproxy(self, want: str, names: list[str], timeout: float = 30) -> float:
        t0 = time.monotonic()
        while True:
            try:
                states = server_states(self.stats)
            except OSError:  # its stats socket is bound a moment before it listens
                states = {}
            if all(states.get(n, "").startswith(want) for n in names):
                return time.monotonic() - t0
            if time.monotonic() - t0 > timeout:
                raise RuntimeError(f"HAProxy states {states}, wanted {want} for {names}")
            time.sleep(0.02)

    def exit_clean(self, proc: subprocess.Popen[bytes]) -> tuple[int, list[str]]:
        code = proc.wait(60)
        return code, segments_of(proc.pid)

    def until(self, what: str, done: Callable[[], bool], timeout: float = 35) -> None:
        """Poll `done` until true; a RuntimeError naming `what` after `timeout` s."""
        deadline = time.monotonic() + timeout
        while not done():
            if time.monotonic() > deadline:
                raise RuntimeError(f"{what}: not within {timeout} s")
            time.sleep(0.01)

    def flowing(self, clients: list[Paced]) -> None:
        """Wait until traffic flows: every client has had a request answered ok since now."""
        t = time.monotonic()
        self.until(
            "every client answered", lambda: self.rec.answered_since(t, [c.name for c in clients])
        )

    def record(self, name: str, t0: float, passed: bool, **extra: Any) -> None:
        # Requests that began in the window end in it (the clients' timeout is 30 s).
        end = time.monotonic()
        self.until("requests of the window answered", lambda: self.rec.settled(end))
        row = {"scenario": name, "seconds": round(time.monotonic() - t0, 1)}
        row.update(self.rec.window(t0, time.monotonic()), **extra)
        row["pass"] = passed and row["failed"] == 0
        self.results.append(row)
        print(json.dumps(row), flush=True)

    def sigterm_one(self) -> None:
        t0 = time.monotonic()
        proc = self.current[0]
        proc.send_signal(signal.SIGTERM)
        down_s = self.wait_haproxy("DOWN", ["n0"])
        code, left = self.exit_clean(proc)
        self.boot(0)
        self.wait_haproxy("UP", ["n0"])
        ok = down_s <= 1.5 and code == 0 and not left
        self.record("SIGTERM one node", t0, ok, marked_down_s=round(down_s, 2), exit=code,
                    segments_left=len(left))  # fmt: skip

    def sigkill_one(self) -> None:
        t0 = time.monotonic()
        self.current[0].kill()
        self.current[0].wait(30)
        self.wait_haproxy("DOWN", ["n0"])
        self.boot(0)  # the new server removes the killed one's segments
        self.wait_haproxy("UP", ["n0"])
        self.record("SIGKILL one front-end", t0, True)
        row = self.results[-1]
        row["pass"] = row["pass"] and (row["max_ms"] or 0) <= 2000

    def link_down(self) -> None:
        t0 = time.monotonic()
        sh("ip", "link", "set", "v0", "down")  # we run in the hub: its end of node 0's link
        time.sleep(self.args.link_down_s)
        sh("ip", "link", "set", "v0", "up")
        self.wait_haproxy("UP", ["n0"])
        self.record(f"link down {self.args.link_down_s:g} s, then up", t0, True)

    def rolling_restart(self) -> None:
        t0 = time.monotonic()
        codes = []
        for i in range(len(self.nodes)):
            proc = self.current[i]
            proc.send_signal(signal.SIGTERM)
            codes.append(self.exit_clean(proc)[0])
            self.boot(i)
            self.wait_haproxy("UP", [f"n{i}"])
        self.record("rolling restart", t0, codes == [0] * len(codes), exits=codes)

    def upgrades(self, clients: list[Paced]) -> None:
        """In place on node 0, clients connected to it directly (not through HAProxy)."""
        for c in clients:
            c.start()
        self.flowing(clients)
        t0 = time.monotonic()
        codes, left = [], 0
        for _ in range(self.args.upgrades):
            old = self.current[0]
            self.boot(0)  # beside the old one: same ports, --reuse-port, sockets handed over
            old.send_signal(signal.SIGTERM)
            code, segs = self.exit_clean(old)
            codes.append(code)
            left += len(segs)
        self.flowing(clients)  # the new server answers every client
        for c in clients:
            c.stop_event.set()
        for c in clients:
            c.join(60)
        self.record(f"--reuse-port upgrade x{self.args.upgrades} (direct clients)", t0,
                    codes == [0] * len(codes) and left == 0, exits=codes)  # fmt: skip
        row = self.results[-1]
        row["pass"] = row["pass"] and row["resets"] == 0 and (row["p99_ms"] or 0) <= 1000

    def main(self) -> int:
        for i in range(len(self.nodes)):
            self.nodes[i].start()
        for i, node in enumerate(self.nodes):
            node.wait_listening(node.procs[0])
            self.current[i] = node.procs[0]
        self.haproxy, self.stats = start_haproxy(self.tmp, len(self.nodes))
        self.wait_haproxy("UP", [f"n{i}" for i in range(len(self.nodes))])
        cap = capacity(node_ip(0), self.texts, self.args.capacity_s)
        rate = 0.4 * cap
        print(json.dumps({"one_node_capacity_rps": round(cap, 1), "offered_rps": round(rate, 1)}))
        clients = mixed_clients(HUB_IP, rate, self.texts, self.rec, "lb-")
        for c in clients:
            c.start()
        self.flowing(clients)
        self.sigterm_one()
        self.sigkill_one()
        self.link_down()
        self.rolling_restart()
        for c in clients:
            c.stop_event.set()
        for c in clients:
            c.join(60)
        self.upgrades(mixed_clients(node_ip(0), rate, self.texts, self.rec, "direct-"))
        print(json.dumps({"binary_resends": dict(Counter(why for _, why in self.rec.resent))}))
        return 0 if all(r["pass"] for r in self.results) else 1

    def cleanup(self) -> None:
        for node in self.nodes:
            node.kill_all()
        if self.haproxy is not None and self.haproxy.poll() is None:
            self.haproxy.kill()
            self.haproxy.wait(10)


def inner(args: argparse.Namespace) -> int:
    tmp = Path(args.tmp)
    run = Run(args, tmp)
    try:
        return run.main()
    finally:
        run.cleanup()


def outer(args: argparse.Namespace) -> int:
    if os.geteuid() != 0 or not shutil.which("haproxy") or not shutil.which("ip"):
        print("benchmarks/cluster.py needs root, iproute2 and haproxy (apt-get install haproxy)")
        return 2
    net = Network(args.nodes)
    tmp = Path(tempfile.mkdtemp(prefix="ringserve-cluster-"))
    child: subprocess.Popen[bytes] | None = None
    try:
        net.up()
        cmd = [
            "ip", "netns", "exec", net.hub, sys.executable, "-m", "benchmarks.cluster", "--inside",
            "--tmp", str(tmp), "--upgrades", str(args.upgrades),
            "--link-down-s", str(args.link_down_s), "--capacity-s", str(args.capacity_s),
            "--node-ns", *net.nodes,
        ]  # fmt: skip
        child = subprocess.Popen(cmd, cwd=ROOT)
        return child.wait()
    finally:
        if child is not None and child.poll() is None:
            child.kill()
            child.wait(30)
        net.down()
        shutil.rmtree(tmp, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--nodes", type=int, default=3)
    p.add_argument("--short", action="store_true",
                   help="2 nodes, 1 upgrade, 2 s link-down, 1.5 s capacity measure")  # fmt: skip
    p.add_argument("--upgrades", type=int, default=10)
    p.add_argument("--link-down-s", type=float, default=10.0)
    p.add_argument("--capacity-s", type=float, default=4.0)
    p.add_argument("--inside", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--tmp", help=argparse.SUPPRESS)
    p.add_argument("--node-ns", nargs="*", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.inside:
        return inner(args)
    if args.short:
        # The link down 2 s: HAProxy marks the node down within about 1 s of it (two failed
        # checks, 0.25 s apart, each a 0.5 s timeout); 1.5 s of 4 closed-loop clients set the rate.
        args.nodes, args.upgrades, args.link_down_s, args.capacity_s = 2, 1, 2.0, 1.5
    return outer(args)


if __name__ == "__main__":
    sys.exit(main())
