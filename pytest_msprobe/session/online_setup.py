"""Setting up `--msprobe-online` (session/online.py runs it): the option (its settings are the ini keys
msprobe_online_*, session/ini_keys.py), msprobe's GPU-side `run_ut` config with `is_online`, the receiver (TCP,
TLS or shared storage) started before anything is collected."""
from __future__ import annotations

import dataclasses
import json
import os
import sys
from typing import Any

import pytest

from . import ini_keys
from .ini_keys import DEFAULT_ONLINE_QUEUE as DEFAULT_QUEUE
from .stash import SETTINGS_KEY


def addoption(group: Any, parser: pytest.Parser) -> None:
    group.addoption("--msprobe-online", default=None, metavar="ADDRESS",
                    help="check a training job's calls as msprobe's online client sends them: tcp://HOST:PORT, "
                         "tls://HOST:PORT (with ini msprobe_online_tls), or nfs://FOLDER (msprobe's nfs_path); "
                         "also taken from --msprobe-config's run_ut section when it has is_online; its settings: "
                         "ini msprobe_online_*")
    parser.addini("msprobe_online_spool", "folder of the received calls' one-call dumps (default "
                  "<--msprobe-out>/online_calls)", default="")


def configure(config: pytest.Config) -> None:
    """Set up the online session when --msprobe-online (or an is_online config) asks for one (the online
    modules, ssl among them, are imported only then: 20-40 ms of every other process's start-up)."""
    opt = config.option
    online_cfg = _config_section(config)
    address, tls_dir = opt.msprobe_online, ini_keys.value(config, "msprobe_online_tls")
    rank_list: tuple[int, ...] | None = None
    if online_cfg is not None:
        rank_list = online_cfg["rank_list"]
        if address is None:
            address, tls_dir = online_cfg["address"], tls_dir or online_cfg["tls_path"]
    if address is None:
        return
    from .online import ONLINE_KEY, OnlineSession, Selection, Spool

    endpoint = _endpoint(config, address, tls_dir)
    settings = config.stash[SETTINGS_KEY]
    settings.check_options = dataclasses.replace(settings.check_options, mode="replay")
    receiver = _receiver(config, endpoint, rank_list)
    try:
        receiver.start()
    except OSError as exc:
        raise pytest.UsageError(f"--msprobe-online {endpoint}: cannot listen: {exc.strerror or exc}") from None
    if endpoint.kind != "nfs":
        endpoint = dataclasses.replace(endpoint, port=receiver.port)
    here = config.invocation_params.dir
    spool_ini = config.getini("msprobe_online_spool")
    spool = (here / spool_ini) if spool_ini else settings.out_dir / "online_calls"
    selection = Selection(rank_list, config.stash.get(_config_key(), None))
    keep = ini_keys.value(config, "msprobe_online_keep")
    online = OnlineSession(config, endpoint, receiver, selection, Spool(spool, keep), _workers(config))
    config.stash[ONLINE_KEY] = online
    config.pluginmanager.register(online, "msprobe-online")
    if config.args_source != pytest.Config.ArgsSource.ARGS:
        config.args[:] = []  # not testpaths, not the current directory: only what the client sends


def _endpoint(config: pytest.Config, address: str, tls_dir: str | None) -> Any:
    """The address to listen on, after the options that cannot go with an online session are refused."""
    from ..online import endpoint as ep

    opt = config.option
    if getattr(opt, "numprocesses", None) or getattr(opt, "tx", None):
        raise pytest.UsageError("--msprobe-online checks the calls as they arrive: -n/xdist cannot split them ahead "
                                "of time; leave -n out (-o msprobe_online_workers=N checks them in N processes)")
    try:
        endpoint = ep.parse(address, tls_dir)
    except ep.EndpointError as exc:
        raise pytest.UsageError(f"--msprobe-online: {exc}") from None
    if opt.msprobe_mode == "rerun":
        raise pytest.UsageError("--msprobe-online replays the device result the client sent: --msprobe-mode rerun "
                                "does not apply")
    return endpoint


def _receiver(config: pytest.Config, endpoint: Any, rank_list: tuple[int, ...] | None) -> Any:
    """What receives the clients' calls: a listening socket (TCP or TLS) or a shared folder (nfs), bounded by the
    queue and frame settings and waiting for the clients `rank_list` (or msprobe_online_clients) names."""
    from ..online import endpoint as ep
    from ..online.protocol import DEFAULT_MAX_FRAME
    from .online import ONLINE_KEY

    size = ini_keys.value(config, "msprobe_online_queue") or DEFAULT_QUEUE
    max_frame = ini_keys.value(config, "msprobe_online_max_frame") or DEFAULT_MAX_FRAME
    clients, ranks = _clients(config, rank_list)
    if size < 1 or max_frame < 1:
        raise pytest.UsageError("msprobe_online_queue and msprobe_online_max_frame must be positive")
    from ..online.receiver import Admission, Receiver

    admission = Admission(size, max_frame, clients, ranks)
    here = config.invocation_params.dir

    def log(line: str) -> None:
        reporter = config.pluginmanager.get_plugin("terminalreporter")  # registered after this hook runs
        if reporter is not None and ONLINE_KEY in config.stash and not config.stash[ONLINE_KEY].closed:
            try:
                reporter.write_line(line, yellow=True)
            except (ValueError, OSError):  # the terminal is gone (the session is ending)
                pass

    if endpoint.kind == "nfs":
        from ..online.nfs import NfsReceiver

        assert endpoint.path is not None
        return NfsReceiver(here / endpoint.path, admission, log=log)

    tls = None
    if endpoint.kind == "tls":
        assert endpoint.path is not None
        try:
            tls = ep.tls_context(here / endpoint.path)
        except ep.EndpointError as exc:
            raise pytest.UsageError(f"--msprobe-online: {exc}") from None
    elif not endpoint.loopback and not ini_keys.value(config, "msprobe_online_listen_any"):
        raise pytest.UsageError(f"--msprobe-online {endpoint}: listening beyond loopback without TLS sends every "
                                "tensor unencrypted; add -o msprobe_online_listen_any=true to do it anyway, or "
                                "use tls:// with -o msprobe_online_tls=DIR")
    if endpoint.kind == "tcp" and not endpoint.loopback:  # before the terminal reporter exists: straight to stderr
        sys.stderr.write(f"msprobe online: WARNING: {endpoint} is not loopback and not TLS: calls arrive unencrypted\n")
    return Receiver(endpoint.host, endpoint.port, admission, tls=tls, log=log)


def _config_key() -> Any:
    from .msprobe_config import CONFIG_KEY

    return CONFIG_KEY


def _config_section(config: pytest.Config) -> dict[str, Any] | None:
    """The online keys of --msprobe-config's run_ut section when it has is_online: true (msprobe 8.1's GPU side)."""
    from .msprobe_config import CONFIG_KEY

    cfg = config.stash.get(CONFIG_KEY, None)
    if cfg is None:
        return None
    body = json.loads(cfg.path.read_text(encoding="utf-8")).get(cfg.section, {})
    if body.get("is_online") is not True:
        return None
    where = f"--msprobe-config {cfg.path}: {cfg.section}"
    rank_list = body.get("rank_list", [0])
    if not isinstance(rank_list, list) or not all(isinstance(r, int) and r >= 0 for r in rank_list):
        raise pytest.UsageError(f"{where}.rank_list must be a list of non-negative integers, got {rank_list!r}")
    tls_path = body.get("tls_path", "./")
    nfs_path = body.get("nfs_path") or ""
    if not isinstance(tls_path, str) or not isinstance(nfs_path, str):
        raise pytest.UsageError(f"{where}: tls_path and nfs_path must be strings")
    if nfs_path:
        address = f"nfs://{nfs_path}"
    else:
        host, port = body.get("host", "127.0.0.1"), body.get("port")
        if not isinstance(host, str) or not isinstance(port, int) or not 0 <= port < 65536:
            raise pytest.UsageError(f"{where}: is_online needs host (a string) and port (0..65535), or nfs_path")
        address = f"{'tls' if tls_path else 'tcp'}://{host}:{port}"
    return {"address": address, "tls_path": tls_path or None, "rank_list": tuple(rank_list)}


def _clients(config: pytest.Config, rank_list: tuple[int, ...] | None) -> tuple[int, tuple[int, ...] | None]:
    """How many clients the session waits for: msprobe_online_clients when given, else the ranks of the GPU-side
    config's rank_list (each must end), else 1."""
    value = ini_keys.value(config, "msprobe_online_clients")
    if value is None:
        return (len(rank_list), rank_list) if rank_list else (1, None)
    if not str(value).strip().isdigit() or int(value) < 1:
        raise pytest.UsageError(f"{ini_keys.where(config, 'msprobe_online_clients')}: {value!r} is not a positive "
                                "integer")
    return int(value), None


def _workers(config: pytest.Config) -> int:
    value = ini_keys.value(config, "msprobe_online_workers") or "1"
    if value == "auto":
        return max(1, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1)
    if not str(value).strip().isdigit() or int(value) < 1:
        raise pytest.UsageError(f"{ini_keys.where(config, 'msprobe_online_workers')}: {value!r} is not a positive "
                                "integer (or auto)")
    return int(value)
