"""What happens to connections waiting in a SO_REUSEPORT listener's accept queue when it closes.

An upgrade with --reuse-port closes the old server's listeners while the new server listens on
the same port. The kernel spreads new connections over both listeners' accept queues, so some
sit in the old one's queue, handshake done, not yet accepted, when it closes. This measures,
with plain sockets on loopback inside a network namespace it makes (so the sysctl it sets
touches nothing else), how many of those are reset:

- `close`: the old listener just closes, net.ipv4.tcp_migrate_req=0 (the kernel default);
- `migrate`: the same with net.ipv4.tcp_migrate_req=1 (Linux 5.14+ moves them to the other);
- `handover`: the old listener's fd is first passed to another process over a Unix socket
  (SCM_RIGHTS), then closed in the old one: the socket lives on in the receiver.

Run as root: `python -m benchmarks.reuseport_queue [--connections N]`.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import time

PORT = 18123


def listener() -> socket.socket:
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    s.bind(("127.0.0.1", PORT))
    s.listen(4096)
    s.setblocking(False)
    return s


def accept_all(s: socket.socket) -> list[socket.socket]:
    got = []
    while True:
        try:
            conn, _ = s.accept()
        except BlockingIOError:
            return got
        got.append(conn)


def outcome(client: socket.socket) -> str:
    """Whether a queued connection survived: an accepted one answers a ping, a reset one not."""
    client.settimeout(2.0)
    try:
        client.sendall(b"p")
        return "ok" if client.recv(1) == b"p" else "closed"
    except ConnectionResetError:
        return "reset"
    except TimeoutError:
        return "timeout"
    except OSError as exc:
        return type(exc).__name__


def run(mode: str, n: int) -> dict[str, int]:
    """In this process: two listeners; `n` queued connections; the old one goes; count fates."""
    old, new = listener(), listener()
    keeper = None
    if mode == "handover":
        keeper = handover(old)
    clients = [socket.create_connection(("127.0.0.1", PORT)) for _ in range(n)]
    time.sleep(0.2)  # every handshake done: all n sit in one queue or the other
    old.close()
    accepted = accept_all(new)
    if keeper is not None:
        keeper.stdin.write(b"accept\n")  # type: ignore[union-attr]
        keeper.stdin.flush()  # type: ignore[union-attr]
    for c in accepted:
        c.setblocking(True)
    echo = {c.getpeername(): c for c in accepted}
    fates: dict[str, int] = {"queued": n, "accepted_by_new": len(accepted)}
    for client in clients:
        peer = echo.get(client.getsockname())
        if peer is not None:
            client.sendall(b"p")
            peer.recv(1)
            peer.sendall(b"p")
            fates["ok"] = fates.get("ok", 0) + int(client.recv(1) == b"p")
        else:
            fate = outcome(client)
            fates[fate] = fates.get(fate, 0) + 1
        client.close()
    if keeper is not None:
        keeper.stdin.close()  # type: ignore[union-attr]
        fates["accepted_by_receiver"] = int(keeper.stdout.read().strip() or 0)  # type: ignore[union-attr]
        keeper.wait(10)
    new.close()
    return fates


RECEIVER = """
import socket, sys
u = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM, fileno=int(sys.argv[1]))
_, fds, _, _ = socket.recv_fds(u, 16, 1)
lst = socket.socket(fileno=fds[0])
u.sendall(b"k")
sys.stdin.readline()
n = 0
lst.setblocking(False)
conns = []
while True:
    try:
        c, _ = lst.accept()
    except BlockingIOError:
        break
    conns.append(c)
for c in conns:
    c.settimeout(2)
    if c.recv(1) == b"p":
        c.sendall(b"p")
        n += 1
sys.stdin.read()
print(n)
"""


def handover(old: socket.socket) -> subprocess.Popen[bytes]:
    """Pass `old`'s fd to a child over a Unix socket (SCM_RIGHTS); the child accepts from it."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    child = subprocess.Popen(
        [sys.executable, "-c", RECEIVER, str(theirs.fileno())],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        pass_fds=(theirs.fileno(),),
    )
    theirs.close()
    socket.send_fds(ours, [b"l"], [old.fileno()])
    assert ours.recv(1) == b"k"
    ours.close()
    return child


def in_namespace(n: int) -> None:
    results = {}
    for mode, migrate in (("close", "0"), ("migrate", "1"), ("handover", "0")):
        with open("/proc/sys/net/ipv4/tcp_migrate_req", "w") as f:
            f.write(migrate)
        results[mode] = run(mode, n)
    print(json.dumps(results))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--connections", type=int, default=200)
    parser.add_argument("--inside", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.inside:
        in_namespace(args.connections)
        return
    ns = f"rsq{os.getpid()}"
    subprocess.run(["ip", "netns", "add", ns], check=True)
    try:
        subprocess.run(["ip", "-n", ns, "link", "set", "lo", "up"], check=True)
        out = subprocess.run(
            ["ip", "netns", "exec", ns, sys.executable, "-m", "benchmarks.reuseport_queue",
             "--inside", "--connections", str(args.connections)],
            check=True, capture_output=True, text=True, timeout=120,
        ).stdout  # fmt: skip
    finally:
        subprocess.run(["ip", "netns", "delete", ns], check=True)
    results = json.loads(out)
    print(f"kernel {os.uname().release}; {args.connections} connections queued, none accepted,")
    print("spread by the kernel over the old and the new listener; then the old one closes:")
    for mode, fates in results.items():
        print(f"  {mode:9s} {fates}")


if __name__ == "__main__":
    main()
