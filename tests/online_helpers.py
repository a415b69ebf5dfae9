"""Shared by the online tests: free ports, starting a client once the session listens, TLS certificates."""
from __future__ import annotations

import shutil
import socket
import subprocess
import threading
import time
from pathlib import Path
from typing import Any


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_for_port(port: int, timeout: float = 60.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()  # a probe: no data, no effect
            return True
        except OSError:
            time.sleep(0.1)
    return False


class Client(threading.Thread):
    """Runs `cmd` once the session listens on `port` (or at once for port None); keeps its output."""

    def __init__(self, cmd: list[str], port: int | None, cwd: Path, env: dict[str, str] | None = None,
                 timeout: float = 240.0) -> None:
        super().__init__(daemon=True)
        self.cmd, self.port, self.cwd, self.env, self.timeout = cmd, port, cwd, env, timeout
        self.result: subprocess.CompletedProcess[str] | None = None
        self.error: str | None = None

    def run(self) -> None:
        if self.port is not None and not wait_for_port(self.port):
            self.error = "the session never listened"
            return
        try:
            self.result = subprocess.run(self.cmd, cwd=self.cwd, env=self.env, capture_output=True, text=True,
                                         timeout=self.timeout)
        except subprocess.TimeoutExpired as exc:
            self.error = f"client timed out: {exc.stdout!r} {exc.stderr!r}"

    def output(self) -> str:
        if self.result is None:
            return str(self.error)
        return self.result.stdout + self.result.stderr


def _openssl(*args: Any, cwd: Path) -> None:
    subprocess.run(["openssl", *map(str, args)], cwd=cwd, check=True, capture_output=True)


def make_certs(folder: Path, server_passphrase: str | None = None, revoke_client: bool = False) -> None:
    """msprobe's tls_path layout in `folder`: ca.crt, server.key/.crt, client.key/.crt, and with `revoke_client`
    a crl.pem revoking client.crt (made with the openssl command line)."""
    if shutil.which("openssl") is None:
        raise RuntimeError("openssl command not found")
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "ext.cnf").write_text(
        "[ca]\nbasicConstraints=critical,CA:true\nkeyUsage=critical,keyCertSign,cRLSign\n"
        "[server]\nbasicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\n"
        "extendedKeyUsage=serverAuth\n"
        "[client]\nbasicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\n"
        "extendedKeyUsage=clientAuth\n")
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.crt", "-days", "2",
             "-subj", "/CN=test-ca", "-extensions", "ca", "-config", _req_config(folder), cwd=folder)
    for who in ("server", "client"):
        key_args = ["-aes256", "-passout", f"pass:{server_passphrase}"] if who == "server" and server_passphrase else []
        _openssl("genrsa", *key_args, "-out", f"{who}.key", "2048", cwd=folder)
        pass_in = ["-passin", f"pass:{server_passphrase}"] if key_args else []
        _openssl("req", "-new", "-key", f"{who}.key", *pass_in, "-subj", f"/CN={who}", "-out", f"{who}.csr",
                 cwd=folder)
        _openssl("x509", "-req", "-in", f"{who}.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
                 "-days", "2", "-extfile", "ext.cnf", "-extensions", who, "-out", f"{who}.crt", cwd=folder)
    if revoke_client:
        (folder / "index.txt").write_text("")
        (folder / "crlnumber").write_text("01\n")
        (folder / "ca.cnf").write_text(
            "[ca]\ndefault_ca=CA_default\n[CA_default]\ndatabase=./index.txt\ncrlnumber=./crlnumber\n"
            "default_md=sha256\ndefault_crl_days=2\n")
        _openssl("ca", "-revoke", "client.crt", "-config", "ca.cnf", "-cert", "ca.crt", "-keyfile", "ca.key",
                 cwd=folder)
        _openssl("ca", "-gencrl", "-config", "ca.cnf", "-cert", "ca.crt", "-keyfile", "ca.key", "-out", "crl.pem",
                 cwd=folder)


def _req_config(folder: Path) -> str:
    path = folder / "req.cnf"
    path.write_text("[req]\ndistinguished_name=dn\n[dn]\n[ca]\nbasicConstraints=critical,CA:true\n"
                    "keyUsage=critical,keyCertSign,cRLSign\n")
    return str(path.resolve())
