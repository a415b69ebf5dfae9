"""`--msprobe-online`: check a training job's API calls as its msprobe client sends them.

The session listens (online/receiver.py, online/nfs.py) before anything runs; `pytest_runtestloop` takes the
calls from the bounded queue one by one, loads each with the restricted unpickler (online/safeload.py),
writes it as a one-call tensor dump (online/spool.py) and runs it as an ordinary `ApiItem` in replay mode
(the device result is the output the client sent), node id `online/rank<r>/step<s>::<call>.forward`. So the
terminal lines, CSVs, JSON lines, JUnit, HTML, --msprobe-save-error-data and --msprobe-repro are those of a
dump item. The items are made as calls arrive, so checking runs in this one process (no xdist).

The session ends when every client has sent STOP_ (or its nfs `end` marker), or on Ctrl-C; the results so
far are written either way. The summary accounts for every call per rank: received = checked + skipped
(with the reasons) + refused.
"""
from __future__ import annotations

import dataclasses
import json
import queue
import shutil
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from .items import ApiItem
from .stash import SETTINGS_KEY

ONLINE_KEY = pytest.StashKey["OnlineSession"]()
DEFAULT_QUEUE = 50  # msprobe's queue of received calls


def addoption(group: Any, parser: pytest.Parser) -> None:
    group.addoption("--msprobe-online", default=None, metavar="ADDRESS",
                    help="check a training job's calls as msprobe's online client sends them: tcp://HOST:PORT, "
                         "tls://HOST:PORT (with --msprobe-online-tls), or nfs://FOLDER (msprobe's nfs_path); "
                         "also taken from --msprobe-config's run_ut section when it has is_online")
    group.addoption("--msprobe-online-tls", default=None, metavar="DIR",
                    help="msprobe's tls_path: server.key, server.crt, ca.crt, optional crl.pem; the key's "
                         "passphrase from $MSPROBE_TLS_PASSPHRASE or the terminal")
    group.addoption("--msprobe-online-queue", type=int, default=None, metavar="N",
                    help=f"calls held between receiving and checking (default {DEFAULT_QUEUE}); clients get "
                         "BUSY_ when it is full")
    group.addoption("--msprobe-online-max-frame", type=int, default=None, metavar="BYTES",
                    help="refuse a call larger than this before reading it (default 4 GiB)")
    group.addoption("--msprobe-online-clients", type=int, default=1, metavar="N",
                    help="end the session only after N clients (ranks) have stopped (default 1, and every client "
                         "that connected)")
    group.addoption("--msprobe-online-listen-any", action="store_true", default=False,
                    help="allow a plain-TCP address other than loopback (calls then cross the network unencrypted)")
    group.addoption("--msprobe-online-idle", type=float, default=None, metavar="SECONDS",
                    help="end the session when no call has arrived for SECONDS before every client stopped (a "
                         "client that died); such a session fails")
    group.addoption("--msprobe-online-keep", action="store_true", default=False,
                    help="keep every received call as a one-call tensor dump (by default only failing ones)")
    parser.addini("msprobe_online_spool", "folder of the received calls' one-call dumps (default "
                  "<--msprobe-out>/online_calls)", default="")


@dataclass
class RankCounts:
    received: int = 0
    checked: int = 0
    skipped: Counter[str] = field(default_factory=Counter)
    refused: Counter[str] = field(default_factory=Counter)

    def line(self, rank: str) -> str:
        skipped, refused = sum(self.skipped.values()), sum(self.refused.values())
        return (f"msprobe online: {rank}: received {self.received} = checked {self.checked} + skipped {skipped} "
                f"+ refused {refused}")


@dataclass(frozen=True)
class Selection:
    """The GPU side's filters of msprobe's run_ut config: rank_list, white_list, black_list."""

    rank_list: tuple[int, ...] | None = None
    config: Any = None  # msprobe_config.RunUtConfig

    def reason(self, rank: int, api: str) -> str | None:
        if self.rank_list is not None and rank not in self.rank_list:
            return f"rank {rank} is not in rank_list {list(self.rank_list)}"
        if self.config is not None and self.config.excluded(api):
            return f"{api} excluded by the white_list/black_list of {self.config.path.name}"
        return None


class OnlineStep(pytest.Collector):
    """The parent of one rank's calls of one step: node id `online/rank<r>/step<s>`."""

    def collect(self) -> list[pytest.Item]:
        return []


class OnlineItem(ApiItem):
    """A received call: replayed (the device result is what the client sent); Aten calls run torch.ops.aten.
    `preset` is the SKIP record of a call skipped before it was written out (nothing to compare)."""

    preset: dict[str, Any] | None = None

    def _check(self, entry_name: str) -> dict[str, Any]:
        if self.preset is not None:
            return dict(self.preset)
        from ..check import check_entry
        from ..dump.reader import load_dump
        from ..runs.memory import keep_freed_memory, release_freed_memory

        options = self.config.stash[SETTINGS_KEY].check_options
        keep_freed_memory()
        try:
            return check_entry(load_dump(self.path), entry_name, options, online_specs(options.specs_file))
        finally:
            release_freed_memory()


def online_specs(specs_file: str | None) -> dict[str, Any]:
    """api_specs for online calls: Aten calls are run (a dump names aten overloads, which are skipped; the
    online client sends overload packets, `Aten.mm.1`)."""
    from ..specs.loader import load_specs

    specs = dict(load_specs(user_file=specs_file))
    specs["unsupported_types"] = {k: v for k, v in specs.get("unsupported_types", {}).items() if k != "Aten"}
    return specs


def skip_reason(data: Any, api: str, specs: dict[str, Any]) -> str | None:
    """Why a received call has nothing to compare, decided before its tensors are written out."""
    from ..specs.loader import in_list

    for group in ("always_skip", "online_skip"):
        if in_list(specs, api, group):
            return f"{data.name}: {specs[group]['reason']}"
    inplace = api.endswith("_") and not api.startswith("_")
    if inplace or "out" in data.kwargs:
        import torch

        inputs = [t for t in [*data.args, *data.kwargs.values()] if isinstance(t, torch.Tensor)]
        results = data.result if isinstance(data.result, (tuple, list)) else [data.result]
        stores = {t.untyped_storage().data_ptr() for t in inputs if t.numel()}
        if any(isinstance(r, torch.Tensor) and r.numel() and r.untyped_storage().data_ptr() in stores for r in results):
            return (f"{data.name}: in-place call sent after it changed its input (input and output share "
                    "storage): the input before the call is unknown, nothing to compare")
        first = data.args[0] if data.args else None
        out = results[0] if results else None
        if inplace and isinstance(first, torch.Tensor) and isinstance(out, torch.Tensor) and \
                first.shape == out.shape and first.dtype == out.dtype and torch.equal(first, out):
            return (f"{data.name}: in-place call whose input equals its output (sent after the call changed it, "
                    "as msprobe 8.1's nfs_path client does): nothing to compare")
    return None


class OnlineSession:
    """The receiver, the loop that turns calls into items, and the per-rank accounting."""

    def __init__(self, config: pytest.Config, endpoint: Any, receiver: Any, selection: Selection, spool: Path,
                 keep: bool) -> None:
        self.config, self.endpoint, self.receiver, self.selection = config, endpoint, receiver, selection
        self.spool, self.keep = spool, keep
        self.counts: dict[str, RankCounts] = {}
        self.steps: dict[tuple[int, int], OnlineStep] = {}
        self.failed: set[str] = set()
        self.order = 0
        self.interrupted = False
        self.idle: float | None = config.getoption("msprobe_online_idle")
        self.idle_ended = False
        self.closed = False
        self.specs = online_specs(config.stash[SETTINGS_KEY].check_options.specs_file)

    def rank(self, rank: int | None) -> RankCounts:
        return self.counts.setdefault("rank ?" if rank is None else f"rank{rank}", RankCounts())

    # ---------------------------------------------------------------- hooks
    def pytest_report_header(self, config: pytest.Config) -> str:
        what = "reading" if self.endpoint.kind == "nfs" else "listening on"
        return f"msprobe online: {what} {self.endpoint}, queue {self.receiver.calls.maxsize} calls, replay mode"

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtestloop(self, session: pytest.Session) -> bool:
        if session.testsfailed and not session.config.option.continue_on_collection_errors:
            raise session.Interrupted(f"{session.testsfailed} error(s) during collection")
        if session.config.option.collectonly:
            return True
        for i, item in enumerate(session.items):  # paths given beside --msprobe-online run first
            nxt = session.items[i + 1] if i + 1 < len(session.items) else None
            item.config.hook.pytest_runtest_protocol(item=item, nextitem=nxt)
            if session.shouldfail or session.shouldstop:
                return True
        try:
            self._loop(session)
        except KeyboardInterrupt:
            self.interrupted = True
            raise
        refused = sum(sum(c.refused.values()) for c in self.counts.values())
        if refused or self.idle_ended or self.receiver.stats.lost:
            session.testsfailed += 1  # refused or lost calls, or a client that never stopped: not green
        return True

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if report.failed:
            self.failed.add(report.nodeid)

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        lines = self.summary_lines()
        if lines:
            terminalreporter.section("msprobe online")
            for line in lines:
                terminalreporter.write_line(line)

    def pytest_unconfigure(self, config: pytest.Config) -> None:
        self.closed = True
        self.receiver.close()

    # ---------------------------------------------------------------- the loop
    def _loop(self, session: pytest.Session) -> None:
        from ..online import safeload

        receiver = self.receiver
        last = time.monotonic()
        while True:
            try:
                call = receiver.calls.get(timeout=0.1)
            except queue.Empty:
                if receiver.finished.is_set() and receiver.calls.empty():
                    return
                if self.idle is not None and time.monotonic() - last > self.idle:
                    self.idle_ended = True
                    receiver.log(f"msprobe online: no call for {self.idle:g} s (--msprobe-online-idle): the session "
                                 "ends before every client stopped")
                    return
                continue
            last = time.monotonic()
            counts = self.rank(call.rank)
            try:
                data = safeload.load_nfs(bytes(call.body)) if call.nfs else safeload.load_tcp(call.body)
            except safeload.Refused as exc:
                counts.received += 1
                counts.refused[str(exc)] += 1
                receiver.log(f"msprobe online: {call.peer} sequence {call.sequence}: refused: {exc}")
                continue
            del call
            if isinstance(data, str):  # an nfs marker read as a call file
                continue
            counts = self.rank(data.rank)
            counts.received += 1
            self._check(session, data, counts)
            if session.shouldfail or session.shouldstop:
                return

    def _check(self, session: pytest.Session, data: Any, counts: RankCounts) -> None:
        from ..dump.reader import parse_entry_name
        from ..online import spool

        name = spool.entry_name(data)
        try:
            api = parse_entry_name(name).api_name
        except ValueError as exc:
            counts.refused[str(exc)] += 1
            return
        reason = self.selection.reason(data.rank, api)
        if reason is not None:
            counts.skipped[reason] += 1
            return
        parent = self._step(session, data.rank, data.step)
        preset = skip_reason(data, api, self.specs)
        folder = Path(parent.path) / f"{self.order:07d}_{data.name}"
        try:
            dump_json, _ = spool.write(data, folder, tensors=preset is None)
        except (OSError, RuntimeError) as exc:
            counts.refused[f"cannot write the call to {folder}: {exc}"] += 1
            return
        del data
        item = OnlineItem.from_parent(parent, name=name, order=self.order, path=dump_json)
        if preset is not None:
            from ..inputs.seeds import item_seed

            call = name.rsplit(".", 1)[0]
            item.preset = {"api": call, "direction": "forward", "status": "SKIP", "message": preset, "outputs": [],
                           "notes": [], "timings": {}, "device": "recorded", "impl": "", "mode": "replay",
                           "seed": item_seed(self.config.stash[SETTINGS_KEY].check_options.run_seed, call)}
        self.order += 1
        session.items.append(item)
        session.testscollected += 1
        item.config.hook.pytest_runtest_protocol(item=item, nextitem=None)
        record = item.stash.get(_record_key(), None) or {}
        if record.get("status") == "SKIP" or (not record and item.nodeid not in self.failed):
            counts.skipped[_reason(record, name)] += 1
        else:
            counts.checked += 1
        if not self.keep and item.nodeid not in self.failed:
            shutil.rmtree(folder, ignore_errors=True)

    def _step(self, session: pytest.Session, rank: int, step: int) -> OnlineStep:
        node = self.steps.get((rank, step))
        if node is None:
            nodeid = f"online/rank{rank}/step{step}"
            node = self.steps[(rank, step)] = OnlineStep.from_parent(
                session, name=nodeid, nodeid=nodeid, path=self.spool / f"rank{rank}" / f"step{step}")
        return node

    def summary_lines(self) -> list[str]:
        lines = []
        for rank in sorted(self.counts):
            c = self.counts[rank]
            lines.append(c.line(rank))
            for label, reasons in (("skipped", c.skipped), ("refused", c.refused)):
                for reason, n in reasons.most_common(8):
                    lines.append(f"  {label} {n}: {reason}")
                if len(reasons) > 8:
                    lines.append(f"  {label} {sum(reasons.values()) - sum(n for _, n in reasons.most_common(8))}: "
                                 f"{len(reasons) - 8} other reason(s), in the JSON lines records")
        stats = self.receiver.stats
        lines += stats.lines[-20:]  # bad peers and refused frames, as logged while they happened
        extra = [f"{k} {v}" for k, v in (("connections", stats.connections), ("CRC errors resent", stats.crc_errors),
                                          ("duplicates dropped", stats.duplicates),
                                          ("calls lost by a client", stats.lost),
                                          ("frames refused unread", stats.refused_frames),
                                          ("connections ended on bad input", stats.dropped)) if v]
        if extra:
            lines.append("msprobe online: " + ", ".join(extra))
        if self.idle_ended:
            lines.append(f"msprobe online: ended after {self.idle:g} s without a call, before every client stopped")
        elif self.interrupted or not self.receiver.finished.is_set():
            lines.append("msprobe online: interrupted before every client stopped; the results so far are written")
        if self.failed:
            lines.append(f"msprobe online: the failing calls are kept as one-call tensor dumps under {self.spool}")
        return lines


def _record_key() -> Any:
    from .items import RECORD_KEY

    return RECORD_KEY


def _reason(record: dict[str, Any], name: str) -> str:
    """A skip reason without the call's own name and index, so equal reasons group."""
    message = str(record.get("message") or "skipped")
    call = name.rsplit(".", 1)[0]
    api = call.rsplit(".", 1)[0]
    return message.replace(call, api).splitlines()[0][:160]


def configure(config: pytest.Config) -> None:
    """Set up the online session when --msprobe-online (or an is_online config) asks for one."""
    from ..online import endpoint as ep
    from ..online.protocol import DEFAULT_MAX_FRAME

    opt = config.option
    online_cfg = _config_section(config)
    address = opt.msprobe_online
    tls_dir = opt.msprobe_online_tls
    rank_list: tuple[int, ...] | None = None
    if online_cfg is not None:
        rank_list = online_cfg["rank_list"]
        if address is None:
            address, tls_dir = online_cfg["address"], tls_dir or online_cfg["tls_path"]
    if address is None:
        return
    if getattr(opt, "numprocesses", None) or getattr(opt, "tx", None):
        raise pytest.UsageError("--msprobe-online checks the calls as they arrive, in this process: -n/xdist cannot "
                                "split them ahead of time; leave -n out")
    try:
        endpoint = ep.parse(address, tls_dir)
    except ep.EndpointError as exc:
        raise pytest.UsageError(f"--msprobe-online: {exc}") from None
    settings = config.stash[SETTINGS_KEY]
    if opt.msprobe_mode == "rerun":
        raise pytest.UsageError("--msprobe-online replays the device result the client sent: --msprobe-mode rerun "
                                "does not apply")
    settings.check_options = dataclasses.replace(settings.check_options, mode="replay")
    size = opt.msprobe_online_queue or DEFAULT_QUEUE
    max_frame = opt.msprobe_online_max_frame or DEFAULT_MAX_FRAME
    if size < 1 or max_frame < 1 or opt.msprobe_online_clients < 1:
        raise pytest.UsageError("--msprobe-online-queue, --msprobe-online-max-frame and --msprobe-online-clients "
                                "must be positive")
    here = config.invocation_params.dir
    def log(line: str) -> None:
        reporter = config.pluginmanager.get_plugin("terminalreporter")  # registered after this hook runs
        if reporter is not None and ONLINE_KEY in config.stash and not config.stash[ONLINE_KEY].closed:
            try:
                reporter.write_line(line, yellow=True)
            except (ValueError, OSError):  # the terminal is gone (the session is ending)
                pass

    receiver: Any
    if endpoint.kind == "nfs":
        from ..online.nfs import NfsReceiver

        assert endpoint.path is not None
        receiver = NfsReceiver(here / endpoint.path, queue_size=size, max_frame=max_frame,
                               clients=opt.msprobe_online_clients, log=log)
    else:
        from ..online.receiver import Receiver

        tls = None
        if endpoint.kind == "tls":
            assert endpoint.path is not None
            try:
                tls = ep.tls_context(here / endpoint.path)
            except ep.EndpointError as exc:
                raise pytest.UsageError(f"--msprobe-online: {exc}") from None
        elif not endpoint.loopback and not opt.msprobe_online_listen_any:
            raise pytest.UsageError(f"--msprobe-online {endpoint}: listening beyond loopback without TLS sends every "
                                    "tensor unencrypted; add --msprobe-online-listen-any to do it anyway, or use "
                                    "tls:// with --msprobe-online-tls")
        receiver = Receiver(endpoint.host, endpoint.port, queue_size=size, max_frame=max_frame, tls=tls,
                            clients=opt.msprobe_online_clients, log=log)
    if endpoint.kind == "tcp" and not endpoint.loopback:
        log(f"msprobe online: WARNING: {endpoint} is not loopback and not TLS: calls arrive unencrypted")
    try:
        receiver.start()
    except OSError as exc:
        raise pytest.UsageError(f"--msprobe-online {endpoint}: cannot listen: {exc.strerror or exc}") from None
    if endpoint.kind != "nfs":
        endpoint = dataclasses.replace(endpoint, port=receiver.port)
    spool_ini = config.getini("msprobe_online_spool")
    spool = (here / spool_ini) if spool_ini else settings.out_dir / "online_calls"
    selection = Selection(rank_list, config.stash.get(_config_key(), None))
    online = OnlineSession(config, endpoint, receiver, selection, spool, opt.msprobe_online_keep)
    config.stash[ONLINE_KEY] = online
    config.pluginmanager.register(online, "msprobe-online")
    if config.args_source != pytest.Config.ArgsSource.ARGS:
        config.args[:] = []  # not testpaths, not the current directory: only what the client sends


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
