"""Certificates for tests that speak TLS, made with the `openssl` command line (no download, no
extra package): a CA, a server certificate for 127.0.0.1 and localhost signed by it, a client
certificate for mutual TLS, and a second CA that signed nothing of ours. EC P-256 keys: each
is made in milliseconds."""

from __future__ import annotations

import shutil
import ssl
import subprocess
from dataclasses import dataclass
from pathlib import Path

EC = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
LEAF = """basicConstraints = critical, CA:FALSE
keyUsage = critical, digitalSignature, keyEncipherment
extendedKeyUsage = {usage}
subjectKeyIdentifier = hash
authorityKeyIdentifier = keyid
{names}"""


@dataclass(frozen=True)
class Pki:
    """Where each file lies (PEM)."""

    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path
    other_ca: Path  # a CA that signed neither certificate above
    other_client_cert: Path  # a client certificate other_ca signed (mTLS must refuse it)
    other_client_key: Path

    def client_context(self, with_cert: bool = False) -> ssl.SSLContext:
        """What a client that trusts our CA uses (with the client certificate for mTLS)."""
        ctx = ssl.create_default_context(cafile=str(self.ca))
        if with_cert:
            ctx.load_cert_chain(str(self.client_cert), str(self.client_key))
        return ctx


def openssl(*args: str, cwd: Path) -> None:
    exe = shutil.which("openssl")
    if exe is None:
        raise RuntimeError("the tests' certificates are made with the openssl command line")
    subprocess.run([exe, *args], cwd=cwd, check=True, capture_output=True)


def make_ca(where: Path, name: str) -> None:
    openssl("req", "-x509", *EC, "-days", "2", "-subj", f"/CN={name}",
            "-keyout", f"{name}.key", "-out", f"{name}.pem", cwd=where)  # fmt: skip


def make_leaf(where: Path, name: str, ca: str, usage: str, names: str = "") -> None:
    """A certificate `name`.pem (key `name`.key) that `ca` signed, for serverAuth or clientAuth."""
    openssl("req", *EC, "-subj", f"/CN={name}", "-keyout", f"{name}.key", "-out", f"{name}.csr",
            cwd=where)  # fmt: skip
    (where / f"{name}.ext").write_text(LEAF.format(usage=usage, names=names))
    openssl("x509", "-req", "-in", f"{name}.csr", "-CA", f"{ca}.pem", "-CAkey", f"{ca}.key",
            "-CAcreateserial", "-days", "2", "-extfile", f"{name}.ext", "-out", f"{name}.pem",
            cwd=where)  # fmt: skip


def make_pki(where: Path) -> Pki:
    where.mkdir(parents=True, exist_ok=True)
    make_ca(where, "ca")
    make_ca(where, "other-ca")
    make_leaf(where, "server", "ca", "serverAuth", "subjectAltName = IP:127.0.0.1, DNS:localhost")
    make_leaf(where, "client", "ca", "clientAuth")
    make_leaf(where, "stranger", "other-ca", "clientAuth")
    return Pki(
        ca=where / "ca.pem",
        server_cert=where / "server.pem",
        server_key=where / "server.key",
        client_cert=where / "client.pem",
        client_key=where / "client.key",
        other_ca=where / "other-ca.pem",
        other_client_cert=where / "stranger.pem",
        other_client_key=where / "stranger.key",
    )
