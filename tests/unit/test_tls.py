"""protocols/tls.py: the server's TLS contexts from --tls-cert, --tls-key and --tls-client-ca,
and each file that cannot serve refused by name before anything starts (real certificates, made
by the openssl command line in milliseconds: devkit/tls.py)."""

from __future__ import annotations

import ssl
import subprocess
from pathlib import Path

import pytest
from ringserve.service.config.settings import Config
from ringserve.service.protocols.tls import ALPN, TlsError, load_tls

from devkit.tls import Pki, make_pki


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


def config(cert: Path | None, key: Path | None, ca: Path | None = None) -> Config:
    return Config(
        tls_cert=None if cert is None else str(cert),
        tls_key=None if key is None else str(key),
        tls_client_ca=None if ca is None else str(ca),
    )


def test_off_unless_asked() -> None:
    assert load_tls(Config()) is None


def test_a_context_a_listener_with_its_alpn(pki: Pki) -> None:
    tls = load_tls(config(pki.server_cert, pki.server_key))
    assert tls is not None and not tls.mutual
    assert set(tls.contexts) == {"http", "operator", "grpc", "binary"} == set(ALPN)
    for ctx in tls.contexts.values():
        assert ctx.verify_mode == ssl.CERT_NONE
        assert ctx.minimum_version >= ssl.TLSVersion.TLSv1_2
    mutual = load_tls(config(pki.server_cert, pki.server_key, pki.ca))
    assert mutual is not None and mutual.mutual
    assert all(c.verify_mode == ssl.CERT_REQUIRED for c in mutual.contexts.values())


def test_each_file_that_cannot_serve_is_named(pki: Pki, tmp_path: Path) -> None:
    encrypted = tmp_path / "encrypted.key"
    subprocess.run(["openssl", "pkey", "-in", str(pki.server_key), "-aes256", "-passout",
                    "pass:secret", "-out", str(encrypted)], check=True)  # fmt: skip
    empty = tmp_path / "empty.pem"
    empty.write_text("")
    cases = [
        (config(pki.server_cert, None), "--tls-cert and --tls-key go together"),
        (config(None, pki.server_key), "--tls-cert and --tls-key go together"),
        (config(None, None, pki.ca), "--tls-client-ca needs --tls-cert"),
        (config(tmp_path / "none.pem", pki.server_key), "none.pem: cannot read it"),
        (config(tmp_path, pki.server_key), "cannot read it"),  # a directory
        (config(empty, pki.server_key), "empty.pem: no PEM CERTIFICATE"),
        (config(pki.server_key, pki.server_key), "no PEM CERTIFICATE"),
        (config(pki.server_cert, pki.server_cert), "--tls-key"),
        (config(pki.server_cert, pki.client_key), "is not the key of --tls-cert"),
        (config(pki.server_cert, encrypted), "the key is encrypted"),
        (config(pki.server_cert, pki.server_key, pki.server_key), "--tls-client-ca"),
    ]
    for settings, said in cases:
        with pytest.raises(TlsError) as refused:
            load_tls(settings)
        assert said in str(refused.value), (settings, refused.value)
