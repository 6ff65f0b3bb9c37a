"""Which requests a web page could have sent without meaning to: the Host and Origin checks of
an HTTP listener (--allowed-hosts).

Host: a page on another site can make a browser reach a server on loopback or a private
network by pointing a name it controls at that address (DNS rebinding); the request then names
that site in its Host header. A listener bound to loopback answers only the names loopback
has (localhost, *.localhost, its addresses) unless --allowed-hosts says more; one bound to
any other address answers any name (it is reachable by name from wherever it is reachable).

Origin: a browser sends a "simple" cross-site POST (a form's content types, no custom header)
without asking the server first, so a page on any site can make a keyless server classify,
and costs it the work. A request whose Origin is neither the request's own host and port
nor one of --allowed-hosts' names, and that carries no key (Authorization), is refused 403
before any routing. A request with no Origin (curl, every SDK, a server) is never refused by
it; nor one with a key, which a browser never adds to a simple request.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping

LOOPBACK_NAMES = ("localhost", "*.localhost")
DEFAULT_PORTS = {b"http": 80, b"https": 443}
SEEN = 1024  # Host values whose judgment is kept (each is parsed once, not once a request)


def is_loopback(address: str) -> bool:
    """A bind address only this machine reaches (127.0.0.0/8, ::1, localhost)."""
    if address.lower() in ("localhost", "localhost."):
        return True
    try:
        return ipaddress.ip_address(address.strip("[]")).is_loopback
    except ValueError:
        return False


def split_authority(value: bytes) -> tuple[str, int | None]:
    """A Host header's (or an origin's) name, lower-case, without a trailing dot, and its port
    (None when it gives none). An IPv6 literal keeps no brackets."""
    text = value.decode("latin-1").strip().lower()
    port: int | None = None
    if text.startswith("["):
        name, _, rest = text[1:].partition("]")
        if rest.startswith(":") and rest[1:].isdigit():
            port = int(rest[1:])
    else:
        name, colon, tail = text.rpartition(":")
        if colon and tail.isdigit() and ":" not in name:
            port = int(tail)
        else:
            name = text
    return name.rstrip("."), port


class HostCheck:
    """One listener's allowed hosts (exact names or addresses, `*.suffix` for a domain's
    names, `*` for any) and the checks of a request's Host and Origin headers."""

    def __init__(self, names: tuple[str, ...], loopback_ips: bool = False) -> None:
        self.any = "*" in names
        self.exact = frozenset(n.lower().rstrip(".") for n in names if not n.startswith("*"))
        self.suffixes = tuple(n[1:].lower() for n in names if n.startswith("*."))
        self.loopback_ips = loopback_ips  # any loopback address, as a literal, is allowed
        self.seen: dict[bytes, bool] = {}  # Host values judged, at most SEEN (a client sends one)

    @classmethod
    def for_listener(cls, setting: str | None, bound: str) -> HostCheck:
        """--allowed-hosts as given, or its default for the address the listener is bound to."""
        if setting is not None and setting.strip():
            return cls(tuple(n.strip() for n in setting.split(",") if n.strip()))
        if is_loopback(bound):
            return cls(LOOPBACK_NAMES, loopback_ips=True)
        return cls(("*",))

    def named(self, name: str) -> bool:
        """`name` is one of the listed names (not merely allowed by `*`)."""
        if name in self.exact or any(name.endswith(s) for s in self.suffixes):
            return True
        if self.loopback_ips:
            try:
                return ipaddress.ip_address(name).is_loopback
            except ValueError:
                return False
        return False

    def refusal(self, headers: Mapping[bytes, bytes]) -> tuple[int, str] | None:
        """(400, why) for a Host not allowed, (403, why) for a cross-site request without a
        key; None for a request to answer. A request without Host (HTTP/1.0) names no host."""
        host = headers.get(b"host")
        if host is not None and not self.any:
            ok = self.seen.get(host)
            if ok is None:
                if len(self.seen) >= SEEN:
                    self.seen.clear()
                ok = self.seen[host] = self.named(split_authority(host)[0])
            if not ok:
                return (
                    400,
                    f"host {split_authority(host)[0]!r} is not served here (--allowed-hosts)",
                )
        origin = headers.get(b"origin")
        if origin is None or b"authorization" in headers:
            return None
        name, port = split_authority(host) if host is not None else ("", None)
        scheme, sep, rest = origin.strip().lower().partition(b"://")
        if not sep or b"/" in rest:  # "null" (a sandboxed page, a file) or not an origin
            return 403, "a cross-origin request needs a key (Authorization) here"
        o_name, o_port = split_authority(rest)
        o_port = o_port or DEFAULT_PORTS.get(scheme)
        same = host is not None and (o_name, o_port) == (name, port or DEFAULT_PORTS.get(scheme))
        if same or self.named(o_name):
            return None
        return 403, f"a request from the page at {o_name!r} needs a key (Authorization) here"
