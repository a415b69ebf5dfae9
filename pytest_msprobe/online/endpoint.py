"""Where an online session listens: `tcp://HOST:PORT`, `tls://HOST:PORT` (certificates in msprobe's
`tls_path` layout) or `nfs://PATH` / a plain folder (msprobe's `nfs_path`), and the TLS context.

Torch- and pytest-free; errors are EndpointError with a one-line message.
"""
from __future__ import annotations

import getpass
import ipaddress
import os
import ssl
from dataclasses import dataclass
from pathlib import Path

PASSPHRASE_ENV = "MSPROBE_TLS_PASSPHRASE"  # the server key's passphrase; else asked for on the terminal
LOOPBACK = ("127.0.0.1", "::1", "localhost")


class EndpointError(Exception):
    """An address or certificate folder that cannot be used."""


@dataclass(frozen=True)
class Endpoint:
    kind: str  # "tcp", "tls" or "nfs"
    host: str = ""
    port: int = 0
    path: Path | None = None  # nfs folder, or the tls_path folder

    def __str__(self) -> str:
        if self.kind == "nfs":
            return f"nfs://{self.path}"
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{self.kind}://{host}:{self.port}"

    @property
    def loopback(self) -> bool:
        if self.host in LOOPBACK:
            return True
        try:
            return ipaddress.ip_address(self.host).is_loopback
        except ValueError:
            return False


def parse(text: str, tls_path: str | None = None) -> Endpoint:
    """`tcp://HOST:PORT`, `tls://HOST:PORT` (needs tls_path), `nfs://PATH` or a path."""
    if "://" not in text:
        return Endpoint("nfs", path=Path(text))
    scheme, _, rest = text.partition("://")
    scheme = scheme.lower()
    if scheme == "nfs":
        if not rest:
            raise EndpointError(f"{text!r}: nfs:// needs a folder")
        return Endpoint("nfs", path=Path(rest))
    if scheme not in ("tcp", "tls"):
        raise EndpointError(f"{text!r}: the scheme must be tcp://, tls:// or nfs://")
    host, sep, port_text = rest.rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port_text.isdigit() or not 0 <= int(port_text) < 65536:
        raise EndpointError(f"{text!r}: expected {scheme}://HOST:PORT with a port in 0..65535")
    if scheme == "tls":
        if not tls_path:
            raise EndpointError(f"{text!r}: tls:// needs the certificate folder (-o msprobe_online_tls=DIR)")
        return Endpoint("tls", host, int(port_text), Path(tls_path))
    return Endpoint("tcp", host, int(port_text))


def tls_context(folder: Path) -> ssl.SSLContext:
    """Server side of msprobe's TLS: TLS 1.2 or later, server.key/server.crt, client certificates required and
    verified against ca.crt, and against crl.pem when the folder has one."""
    names = {n: folder / n for n in ("server.key", "server.crt", "ca.crt")}
    missing = [n for n, p in names.items() if not p.is_file()]
    if missing:
        raise EndpointError(f"tls_path {folder}: missing {', '.join(missing)} (expected server.key, server.crt, "
                            "ca.crt and optionally crl.pem)")
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.set_ciphers("ECDHE+AESGCM:ECDHE+CHACHA20:DHE+AESGCM:DHE+CHACHA20")  # AEAD suites only, as msprobe's list
    try:
        ctx.load_cert_chain(names["server.crt"], names["server.key"], password=_passphrase)
        ctx.load_verify_locations(cafile=names["ca.crt"])
        crl = folder / "crl.pem"
        if crl.is_file():
            ctx.load_verify_locations(cafile=crl)
            ctx.verify_flags |= ssl.VERIFY_CRL_CHECK_LEAF
    except (ssl.SSLError, OSError) as exc:
        raise EndpointError(f"tls_path {folder}: {getattr(exc, 'reason', None) or exc}") from None
    ctx.verify_mode = ssl.CERT_REQUIRED
    return ctx


def _passphrase() -> str:
    """Called by OpenSSL only for an encrypted key: the environment variable, else a terminal prompt."""
    value = os.environ.get(PASSPHRASE_ENV)
    if value is not None:
        return value
    try:
        return getpass.getpass("server.key passphrase: ")
    except (EOFError, OSError):
        raise EndpointError(f"server.key is encrypted: set {PASSPHRASE_ENV} or run on a terminal") from None
