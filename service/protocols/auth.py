"""Who may call what: the API key's checks (HTTP, binary port, control socket) and the operator
listener that takes /metrics, /v1/stats and /dashboard off the inference port.

The key is held only as its SHA-256 digest, and a given key is compared digest to digest with
hmac.compare_digest: constant time whatever the given key's length (comparing the raw strings
would leak the key's length). The key itself is never logged, never echoed in an error, and never
shown in /v1/stats; given on the command line, it is overwritten in the process's argument area
so that `ps` and /proc/PID/cmdline no longer show it (the environment variable is the documented
way: it never reaches `ps` at all), and given in the environment, it is unset before the workers
start and overwritten in the stale copy that /proc/PID/environ shows.
"""

from __future__ import annotations

import ctypes
import hashlib
import hmac
import re
from collections.abc import Callable
from pathlib import Path

from ringserve.service.engine.tenants import KeyRing, Tenant
from ringserve.service.protocols.admit import latency_header
from ringserve.service.protocols.http import Exchange, HttpProtocol, protocol_of
from ringserve.service.protocols.peers import KeyFailures
from ringserve.wire.frames import AUTH_PREFIX, LENGTH, OK, TAG, status_answer

ENV = "RINGSERVE_API_KEY"
DENIED = "missing or invalid API key"
THROTTLED = "too many failed API key attempts from this address: retry after the wait"
CHALLENGE = (b"www-authenticate", b'Bearer realm="ringserve"')
# Probes stay open: a kubelet or load balancer must see health without holding the key.
OPEN_PATH = re.compile(
    rb"^/health$|^/v2/health/(live|ready)$|^/v2/models/[^/]+(/versions/[^/]+)?/ready$"
)  # TEI's /health too
AUTH_MAX = 4096  # longest AUTH frame text: a key is short; a longer first frame is refused
AUTH_OK = status_answer(0, OK)
_KEY_CHARS = re.compile(r"^[\x21-\x7e]+$")


def check_key(key: str) -> str:
    """The key as given, or a clear refusal that does not repeat it."""
    if not key:
        raise SystemExit("ringserve: --api-key is empty (unset it to serve without a key)")
    if not _KEY_CHARS.match(key):
        raise SystemExit(
            "ringserve: --api-key must be printable ASCII without spaces (not shown here)"
        )
    if len(key) > AUTH_MAX - len(AUTH_PREFIX):
        raise SystemExit(f"ringserve: --api-key is longer than {AUTH_MAX - 5} characters")
    return key


def _digest(data: bytes) -> bytes:
    return hashlib.sha256(data).digest()


class ApiKey:
    """One server's key, kept as a digest, and the count of refused attempts per protocol."""

    def __init__(self, key: str) -> None:
        self._digest = _digest(check_key(key).encode("ascii"))
        self.failures: dict[str, int] = {}

    def __repr__(self) -> str:
        return "ApiKey(<hidden>)"

    def matches(self, given: bytes) -> bool:
        return hmac.compare_digest(_digest(given), self._digest)

    def bearer_ok(self, header: bytes | None) -> bool:
        """`Authorization: Bearer KEY`; the scheme name is case-insensitive (RFC 7235)."""
        if header is None:
            return False
        scheme, _, token = header.strip().partition(b" ")
        return scheme.lower() == b"bearer" and self.matches(token.strip())

    def refused(self, protocol: str) -> None:
        self.failures[protocol] = self.failures.get(protocol, 0) + 1


# -- HTTP -----------------------------------------------------------------------------------------
Route = Callable[["HttpProtocol", "Exchange"], None]


def guard_http(keys: KeyRing, route: Route, failures: KeyFailures | None = None) -> Route:
    """Every path but the probes needs a key; without one, 401 before any routing (so an
    unknown caller learns nothing, not even which paths exist). The key's tenant goes with the
    exchange, for its rate, its priority and its counts. A client address past its failed
    attempts (`failures`, --auth-failures) gets 429 with Retry-After, its key not checked, until
    its allowance refills: guessing goes no faster than that, however fast it sends."""

    def guarded(conn: HttpProtocol, ex: Exchange) -> None:
        path = ex.url.split(b"?", 1)[0]
        if OPEN_PATH.match(path):
            ex.tenant = keys.bearer(ex.headers.get(b"authorization"))
            route(conn, ex)
            return
        wait = failures.wait_s(conn.peer) if failures is not None else 0
        if wait:
            keys.refused(protocol_of(path))
            extra = [(b"retry-after", str(wait).encode()), latency_header(conn, ex)]
            conn.respond_error(ex, 429, THROTTLED, extra)
            return
        tenant = keys.bearer(ex.headers.get(b"authorization"))
        if tenant is not None:
            ex.tenant = tenant
            route(conn, ex)
            return
        keys.refused(protocol_of(path))
        if failures is not None:
            failures.failed(conn.peer)
        conn.respond_error(ex, 401, DENIED, [CHALLENGE, latency_header(conn, ex)])

    return guarded


# -- binary port ----------------------------------------------------------------------------------
def read_auth_frame(buffer: bytearray, keys: KeyRing) -> Tenant | bool | None:
    """The first frame of a binary connection: the key's Tenant (and the frame removed from
    `buffer`) when it is `AUTH KEY` with tag 0, False when it cannot be, None while it is
    incomplete."""
    if len(buffer) < LENGTH.size:
        return None
    (n,) = LENGTH.unpack_from(buffer)
    if n > AUTH_MAX or n <= len(AUTH_PREFIX):
        return False
    end = LENGTH.size + n + TAG.size
    if len(buffer) < end:
        return None if buffer[4 : 4 + len(AUTH_PREFIX)] == AUTH_PREFIX[: len(buffer) - 4] else False
    text = bytes(buffer[4 : 4 + n])
    (tag,) = TAG.unpack_from(buffer, end - TAG.size)
    if tag != 0 or not text.startswith(AUTH_PREFIX):
        return False
    tenant = keys.identify(text[len(AUTH_PREFIX) :])
    if tenant is None:
        return False
    del buffer[:end]
    return tenant


# -- control socket -------------------------------------------------------------------------------
def control_ok(key: ApiKey | None, doc: dict[str, object]) -> bool:
    """A control request carries the key as `"key"` when the server has one."""
    if key is None:
        return True
    given = doc.get("key")
    ok = isinstance(given, str) and given.isascii() and key.matches(given.encode("ascii"))
    if not ok:
        key.refused("control")
    return ok


# -- the process's own command line and environment ----------------------------------------------
def _proc_areas() -> tuple[tuple[int, int], tuple[int, int]] | None:
    """(arg_start, arg_end), (env_start, env_end): fields 48-51 of /proc/self/stat."""
    try:
        after_comm = Path("/proc/self/stat").read_bytes().rsplit(b")", 1)[1].split()
        a, b, c, d = (int(v) for v in after_comm[45:49])
    except (OSError, ValueError):
        return None
    return (a, b), (c, d)


def _overwrite(area: tuple[int, int], needle: bytes, skip: int = 0) -> bool:
    """Overwrite with `*` every occurrence of `needle` in the area, but its first `skip` bytes."""
    start, end = area
    if not 0 < start < end or end - start > 1 << 22:
        return False
    text = ctypes.string_at(start, end - start)
    at, found = text.find(needle), False
    while at >= 0:
        ctypes.memset(start + at + skip, ord("*"), len(needle) - skip)
        found = True
        at = text.find(needle, at + len(needle))
    return found


def scrub_process(secret: str, on_command_line: bool) -> bool:
    """Overwrite the key in this process's argument area (what /proc/PID/cmdline and `ps`
    show) when it was given there, and in its initial environment block (/proc/PID/environ).
    Safe: Python and libc work from their own copies of both, and the caller has already
    unset the variable, so no environ pointer still leads into the block. True when every
    place the key was expected was found and overwritten."""
    areas = _proc_areas()
    if areas is None:
        return False
    args, env = areas
    _overwrite(env, b"\0" + ENV.encode() + b"=" + secret.encode(), skip=len(ENV) + 2)
    _overwrite(env, ENV.encode() + b"=" + secret.encode(), skip=len(ENV) + 1)  # the first var
    return _overwrite(args, secret.encode()) if on_command_line else True
