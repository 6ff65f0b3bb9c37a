"""Who is calling, for every protocol: the keys of `--api-key` and `--api-keys FILE`, each with
its tenant, its rate (a token bucket) and its priority, and what each tenant was answered.

Protocol-neutral on purpose: a front-end asks `KeyRing.identify(token)` for the caller's
`Tenant` (None: 401), then `Tenant.take(now_ns)` (0: over its rate, answer 429 after
`retry_after_s`), then `Tenant.priority_for(asked)`, and hands the priority to the dispatcher.
HTTP, KServe and the binary port do exactly that; the gRPC front-end can too.

Keys are held only as SHA-256 digests and compared with hmac.compare_digest against every entry
(no early exit), so the time taken says nothing of which key, or how much of one, matched.
"""

from __future__ import annotations

import hashlib
import hmac
import math
import re
from dataclasses import dataclass, field

INTERACTIVE = 0
BULK = 1
PRIORITIES = {"interactive": INTERACTIVE, "bulk": BULK}
PRIORITY_NAMES = {v: k for k, v in PRIORITIES.items()}
_KEY = re.compile(r"^[\x21-\x7e]{1,4000}$")
_TENANT = re.compile(r"^[A-Za-z0-9._-]{1,64}$")
_FIELDS = ("tenant", "rate", "burst", "priority")


class KeyFileError(ValueError):
    """A line of the key file that cannot be used; the message names the line, never the key."""


def digest(data: bytes) -> bytes:
    return hashlib.sha256(data).digest()


@dataclass(slots=True)
class Tenant:
    """One key's entry: its tenant's name, rate limit and priority, and its token bucket."""

    name: str  # "" for the unnamed key of --api-key
    rate: float | None = None  # requests a second; None: unlimited
    burst: float = 1.0  # the bucket's size: requests that may come at once after a quiet spell
    priority: int = INTERACTIVE
    tokens: float = 0.0
    stamp_ns: int = 0  # when `tokens` was last brought up to date (0: full)

    def take(self, now_ns: int, n: int = 1) -> int:
        """How many of `n` requests arriving now are within the rate (each takes a token)."""
        if self.rate is None:
            return n
        if self.stamp_ns == 0:
            self.tokens = self.burst
        else:
            self.tokens = min(self.burst, self.tokens + (now_ns - self.stamp_ns) * self.rate / 1e9)
        self.stamp_ns = now_ns
        k = min(n, int(self.tokens))
        self.tokens -= k
        return k

    def retry_after_s(self) -> int:
        """Whole seconds until the next token (Retry-After), at least 1."""
        if self.rate is None:
            return 1
        return max(1, math.ceil((1 - self.tokens) / self.rate))

    def priority_for(self, asked: int | None) -> int:
        """A request may lower its priority, never raise it above its key's."""
        return self.priority if asked is None else max(self.priority, asked)

    def same_limits(self, other: Tenant) -> bool:
        return (self.name, self.rate, self.burst) == (other.name, other.rate, other.burst)


@dataclass
class TenantCounts:
    """What one tenant was answered, counted where answers are written."""

    codes: dict[str, dict[int, int]] = field(default_factory=dict)  # protocol -> code -> n
    texts: int = 0  # admitted
    bulk: int = 0  # of those, admitted as bulk (by the key's priority or the request's own)
    limited: int = 0  # requests over their key's rate (429, binary status 6)

    def total(self, code: int | None = None) -> int:
        return sum(n for by in self.codes.values() for c, n in by.items() if code in (None, c))


def parse_priority(text: str, where: str) -> int:
    value = PRIORITIES.get(text.strip().lower())
    if value is None:
        raise KeyFileError(f"{where}: priority must be interactive or bulk")
    return value


def _number(text: str, what: str, where: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise KeyFileError(f"{where}: {what} must be a number") from None
    if not (value > 0 and math.isfinite(value)):
        raise KeyFileError(f"{where}: {what} must be above 0")
    return value


def parse_line(line: str, where: str) -> tuple[str, Tenant] | None:
    """One line of the key file: `KEY tenant=NAME [rate=R] [burst=B] [priority=P]`, or None
    for a blank or comment line. `#` starts a comment at the line's start or after a space."""
    words = []
    for word in line.split():
        if word.startswith("#"):
            break
        words.append(word)
    if not words:
        return None
    key, *pairs = words
    if not _KEY.match(key) or "=" in key:
        raise KeyFileError(f"{where}: the first word must be the key (printable ASCII, no '=')")
    given: dict[str, str] = {}
    for pair in pairs:
        name, eq, value = pair.partition("=")
        if not eq or name not in _FIELDS:
            raise KeyFileError(f"{where}: unknown field {name[:40]!r} ({', '.join(_FIELDS)})")
        if name in given:
            raise KeyFileError(f"{where}: {name} given twice")
        given[name] = value
    tenant = given.get("tenant")
    if tenant is None:
        raise KeyFileError(f"{where}: tenant=NAME is required")
    if not _TENANT.match(tenant):
        raise KeyFileError(f"{where}: tenant must be 1 to 64 of A-Z a-z 0-9 . _ -")
    rate = _number(given["rate"], "rate", where) if "rate" in given else None
    if "burst" in given and rate is None:
        raise KeyFileError(f"{where}: burst needs a rate")
    burst = _number(given["burst"], "burst", where) if "burst" in given else max(1.0, rate or 1)
    if burst < 1:
        raise KeyFileError(f"{where}: burst must be at least 1")
    priority = parse_priority(given["priority"], where) if "priority" in given else INTERACTIVE
    return key, Tenant(tenant, rate, burst, priority)


def parse_keys(text: str, source: str) -> list[tuple[bytes, Tenant]]:
    """Every key of a key file as (digest, Tenant); KeyFileError names the first bad line."""
    out: list[tuple[bytes, Tenant]] = []
    seen: dict[bytes, int] = {}
    for number, line in enumerate(text.splitlines(), 1):
        where = f"{source} line {number}"
        parsed = parse_line(line, where)
        if parsed is None:
            continue
        key, tenant = parsed
        d = digest(key.encode("ascii"))
        if d in seen:
            raise KeyFileError(f"{where}: the same key as line {seen[d]}")
        seen[d] = number
        out.append((d, tenant))
    return out


def read_key_file(path: str) -> list[tuple[bytes, Tenant]]:
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except (OSError, UnicodeDecodeError) as exc:
        raise KeyFileError(f"{path}: cannot be read: {exc.__class__.__name__}") from None
    return parse_keys(text, path)


class KeyRing:
    """Every key the server accepts, the refusals per protocol, and the counts per tenant."""

    def __init__(self, single: str | None = None, path: str | None = None) -> None:
        self.path = path
        self.single = [(digest(single.encode("ascii")), Tenant(""))] if single else []
        self.entries: list[tuple[bytes, Tenant]] = []
        self.failures: dict[str, int] = {}  # protocol -> refused attempts
        self.tenants: dict[str, TenantCounts] = {}  # name -> counts ("" for the unnamed key)
        if path is not None:
            self.install(read_key_file(path))

    def __repr__(self) -> str:
        return f"KeyRing(<{len(self.entries) + len(self.single)} hidden>)"

    @property
    def named(self) -> bool:
        """Keys with tenant names are in use: metrics carry a `tenant` label."""
        return self.path is not None

    def install(self, entries: list[tuple[bytes, Tenant]]) -> None:
        """Take a new set of keys; a key kept with the same limits keeps its bucket."""
        old = {d: t for d, t in self.entries}
        for i, (d, t) in enumerate(entries):
            prev = old.get(d)
            if prev is not None and prev.same_limits(t):
                prev.priority = t.priority
                entries[i] = (d, prev)
        self.entries = entries
        for _, t in entries:
            self.tenants.setdefault(t.name, TenantCounts())

    def reload(self) -> str | None:
        """Re-read the key file; on any error keep the keys in force and say why."""
        if self.path is None:
            return None
        try:
            self.install(read_key_file(self.path))
        except KeyFileError as exc:
            return str(exc)
        return None

    def identify(self, given: bytes) -> Tenant | None:
        """The entry of the key given, or None; every entry is compared, in constant time."""
        d = digest(given)
        found: Tenant | None = None
        for want, tenant in (*self.single, *self.entries):
            if hmac.compare_digest(d, want):
                found = tenant
        return found

    def bearer(self, header: bytes | None) -> Tenant | None:
        """`Authorization: Bearer KEY`; the scheme name is case-insensitive (RFC 7235)."""
        if header is None:
            return None
        scheme, _, token = header.strip().partition(b" ")
        return self.identify(token.strip()) if scheme.lower() == b"bearer" else None

    def refused(self, protocol: str) -> None:
        self.failures[protocol] = self.failures.get(protocol, 0) + 1

    def admitted(self, name: str, texts: int, priority: int) -> None:
        c = self.counts(name)
        c.texts += texts
        if priority == BULK:
            c.bulk += texts

    def counts(self, name: str) -> TenantCounts:
        c = self.tenants.get(name)
        if c is None:
            c = self.tenants[name] = TenantCounts()
        return c

    def table(self) -> list[dict[str, object]]:
        """The tenant table of /v1/stats: each tenant's keys' limits and what it was answered."""
        keys: dict[str, list[Tenant]] = {}
        for _, t in (*self.single, *self.entries):
            keys.setdefault(t.name, []).append(t)
        rows: list[dict[str, object]] = []
        for name in sorted(set(keys) | set(self.tenants)):
            c = self.counts(name)
            ts = keys.get(name, [])
            rows.append(
                {
                    "tenant": name,
                    "keys": len(ts),
                    "rate": [t.rate for t in ts],
                    "priority": sorted({PRIORITY_NAMES[t.priority] for t in ts}),
                    "requests": c.total(),
                    "ok": c.total(200),
                    "limited": c.limited,
                    "refused": c.total(503),
                    "texts": c.texts,
                    "bulk_texts": c.bulk,
                    "by_protocol": {
                        p: {str(k): n for k, n in by.items()} for p, by in c.codes.items()
                    },
                }
            )
        return rows
