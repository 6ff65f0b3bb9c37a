"""TLS on the TCP ports (--tls-cert, --tls-key, --tls-client-ca): the server's contexts, built
and checked once before anything starts, one a port kind for its ALPN.

TLS wraps at the asyncio level (handover.listen gives `create_server` the port's context), so
a listening socket handed over across a --reuse-port upgrade serves TLS as a bound one does.
The protocols above see plain bytes: every limit of theirs holds as before, counted from the
end of the handshake (connection_made); the handshake itself must end within --read-timeout-s.
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass

from ringserve.service.settings import Config

# What each listener offers in ALPN: HTTP/1.1 on the HTTP and operator ports (a client that
# offers h2 too, as curl does, is answered http/1.1), h2 alone on the gRPC port (grpc clients
# require it), nothing on the binary port (no registered name; the client offers none).
ALPN = {"http": ["http/1.1"], "operator": ["http/1.1"], "grpc": ["h2"], "binary": []}


class TlsError(ValueError):
    """A certificate, key or CA file that cannot serve: which option, which file, and why."""


@dataclass(frozen=True)
class Tls:
    """The contexts of one server's listeners, by listener name (handover.listen's)."""

    contexts: dict[str, ssl.SSLContext]
    mutual: bool  # client certificates are required

    def context(self, listener: str) -> ssl.SSLContext:
        return self.contexts[listener]


def load_tls(settings: Config) -> Tls | None:
    """The contexts --tls-cert, --tls-key and --tls-client-ca ask for; None when TLS is off.
    Raises TlsError naming the option and the file."""
    cert, key, ca = settings.tls_cert, settings.tls_key, settings.tls_client_ca
    if cert is None and key is None:
        if ca is not None:
            raise TlsError("--tls-client-ca needs --tls-cert and --tls-key")
        return None
    if cert is None or key is None:
        raise TlsError("--tls-cert and --tls-key go together: give both")
    read_pem("--tls-cert", cert, "CERTIFICATE")
    if "ENCRYPTED" in read_pem("--tls-key", key, "PRIVATE KEY"):
        raise TlsError(f"--tls-key {key}: the key is encrypted; give it unencrypted (mode 0600)")
    if ca is not None:
        read_pem("--tls-client-ca", ca, "CERTIFICATE")
    contexts = {name: server_context(cert, key, ca, alpn) for name, alpn in ALPN.items()}
    return Tls(contexts, mutual=ca is not None)


def read_pem(option: str, path: str, label: str) -> str:
    """The file's text, checked to hold a PEM block of `label` (open's own error otherwise)."""
    try:
        with open(path, encoding="ascii", errors="replace") as f:
            text = f.read(1 << 20)
    except OSError as exc:
        raise TlsError(f"{option} {path}: cannot read it: {exc.strerror or exc}") from None
    if f"-----BEGIN {label}" not in text and not (
        label == "PRIVATE KEY" and "PRIVATE KEY-----" in text  # BEGIN EC/RSA PRIVATE KEY
    ):
        raise TlsError(f"{option} {path}: no PEM {label} in it")
    return text


def server_context(cert: str, key: str, ca: str | None, alpn: list[str]) -> ssl.SSLContext:
    """A server context of Python's defaults (TLS 1.2 and up, no compression, the default
    ciphers), the chain and key loaded, client certificates required when `ca` is given."""
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    try:
        ctx.load_cert_chain(cert, key, password=refuse_password)
    except ssl.SSLError as exc:
        if exc.reason == "KEY_VALUES_MISMATCH":
            raise TlsError(f"--tls-key {key} is not the key of --tls-cert {cert}") from None
        raise TlsError(f"--tls-cert {cert} with --tls-key {key}: cannot load them: {exc}") from None
    if ca is not None:
        try:
            ctx.load_verify_locations(cafile=ca)
        except ssl.SSLError as exc:
            raise TlsError(f"--tls-client-ca {ca}: cannot load it: {exc}") from None
        ctx.verify_mode = ssl.CERT_REQUIRED
    if alpn:
        ctx.set_alpn_protocols(alpn)
    return ctx


def refuse_password() -> bytes:
    """Never prompt on the terminal for a key's pass phrase (OpenSSL would)."""
    raise TlsError("the key is encrypted; give it unencrypted")
