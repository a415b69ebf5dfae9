"""`--msprobe-online`: check a training job's API calls as its msprobe client sends them.

The session listens (online/receiver.py, online/nfs.py) before anything runs; `pytest_runtestloop` takes the
calls from the bounded queue one by one, loads each with the restricted unpickler (online/safeload.py),
writes it as a one-call tensor dump (online/spool.py) and runs it as an ordinary `ApiItem` in replay mode
(the device result is the output the client sent), node id `online/rank<r>/step<s>::<call>.forward`. So the
terminal lines, CSVs, JSON lines, JUnit, HTML, --msprobe-save-error-data and --msprobe-repro are those of a
dump item. The items are made as calls arrive, so xdist (which collects before it runs) does not fit.

`msprobe_online_workers` N (N > 1) checks in N worker processes (online/checking.py's CheckerPool, the
same check_entry on the same one-call dump): this process sends each written call to a worker, and runs
the items in arrival order as their records come back, so reports and files are written here as with one
process. At most 2 N calls are out at once; beyond that the receiver's queue fills and clients get BUSY_.
A failing call is checked again here when --msprobe-save-error-data, --msprobe-repro or an HTML report
wants its tensors (they are captured where the check runs); a worker's crash fails only its call.

The session ends on its clients' word (the receiver's `finished`: the expected clients have ended, by STOP_,
an nfs `end` marker or a closed connection), after msprobe_online_idle, or on Ctrl-C; the results so far
are written either way. A connection is a client once a call of it loads (receiver.accept); what a stranger
sent is counted apart. The summary accounts for every call per rank: received = checked + skipped (with the
reasons) + refused, and says per client what it numbered, what arrived and how it ended; the run fails when a
body was refused, a call was lost, a client ended without its STOP_ or the session ended idle.
"""
from __future__ import annotations

import queue
import shutil
import time
from collections import Counter, deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from ..online.checking import RankCounts, WorkersFailed
from ..online.connection import listed
from ..records.record import Record
from . import ini_keys
from .items import ApiItem
from .stash import SETTINGS_KEY

ONLINE_KEY = pytest.StashKey["OnlineSession"]()
INTERRUPTED = "the session was interrupted before the call's check finished"
STOPPED = "not reported: the session stopped early (-x or --maxfail)"
QUIET_S = 30.0  # no call for this long: the terminal says once who the session is waiting for
STRANGER_LINES = 20  # refused bodies of connections that are not clients that get a line each


@dataclass(frozen=True)
class Spool:
    """Where each call becomes a one-call tensor dump, and whether a passing call's dump stays there."""

    folder: Path
    keep: bool


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
    `preset` is the SKIP record of a call skipped before it was written out (nothing to compare); `answer`
    what a worker process made of it (CheckerPool.results)."""

    preset: Record | None = None
    answer: tuple[str, Any] | None = None
    counts: RankCounts | None = None

    def _check(self, entry_name: str) -> Record:
        if self.preset is not None:
            return self.preset.copy()
        from ..online.checking import check_call, online_specs
        from ..runs import capture

        settings = self.config.stash[SETTINGS_KEY]
        if self.answer is not None:
            kind, value = self.answer
            if kind == "crashed":
                from .guard import failure_record

                record = failure_record(self.nodeid, value, settings.check_options.run_seed, order=self.order)
                assert record is not None  # an online item's name is a parsed entry name
                record.crashed = True
                return record
            if kind == "raised":
                raise RuntimeError(f"the check raised in an online worker process:\n{value}")
            answered: Record = value
            failed = answered.status == "error" or (answered.status == "Warning" and settings.warning_as_error)
            if not (failed and capture.active()):
                return answered.copy()
            # failing, and the triage tools want its tensors: they are captured where the check runs
        options = settings.check_options
        return check_call(self.path, entry_name, options, online_specs(options.specs_file))


class OnlineSession:
    """The receiver, the loop that turns calls into items, and the per-rank accounting."""

    def __init__(self, config: pytest.Config, endpoint: Any, receiver: Any, selection: Selection, spool: Spool,
                 workers: int = 1) -> None:
        from ..online.checking import online_specs

        self.config, self.endpoint, self.receiver, self.selection = config, endpoint, receiver, selection
        self.spool, self.keep, self.workers = spool.folder, spool.keep, workers
        self.counts: dict[str, RankCounts] = {}
        self.steps: dict[tuple[int, int], OnlineStep] = {}
        self.failed: set[str] = set()
        self.order = 0
        self.interrupted = False
        self.idle: float | None = ini_keys.value(config, "msprobe_online_idle")
        self.idle_ended = False
        self.quiet_said = False
        self.shown = 0  # online items reported, for the progress line
        self.strangers: dict[str, Counter[str]] = {}  # refused bodies of connections that are not clients
        self.closed = False
        self.specs = online_specs(config.stash[SETTINGS_KEY].check_options.specs_file)
        self.pool: Any = None  # online.checking.CheckerPool with workers > 1, started when the loop starts
        self.pending: deque[OnlineItem] = deque()  # written calls not yet reported, in arrival order
        self.window = 2 * workers  # calls out to the workers at most: one running, one waiting each

    def rank(self, rank: int | None) -> RankCounts:
        return self.counts.setdefault("rank ?" if rank is None else f"rank{rank}", RankCounts())

    # ---------------------------------------------------------------- hooks
    def pytest_report_header(self, config: pytest.Config) -> str:
        what = "reading" if self.endpoint.kind == "nfs" else "listening on"
        where = f"{self.workers} worker processes" if self.workers > 1 else "this process"
        return (f"msprobe online: {what} {self.endpoint}, queue {self.receiver.calls.maxsize} calls, replay mode, "
                f"checked in {where}")

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
            if self.workers > 1:
                self.pool = _start_pool(self.config, self.workers)
            self._loop(session)
            self._unreported(STOPPED)  # -x or --maxfail stopped the loop with calls still out
        except WorkersFailed as exc:
            self._unreported(f"not checked: {exc}")
            raise session.Interrupted(f"msprobe online: {exc}") from None
        except KeyboardInterrupt:
            self.interrupted = True
            try:
                if self.pool is not None:  # what the workers finished is reported
                    self._collect(session, 0.0)
            except KeyboardInterrupt:
                pass
            self._unreported(INTERRUPTED)
            raise
        finally:
            if self.pool is not None:
                self.pool.close()
        if self.red():
            session.testsfailed += 1  # refused or lost calls, or a client that never stopped: not green
        return True

    def red(self) -> bool:
        """Whether the run did not check everything its clients sent: a refused body (a client's, or a
        stranger's pickle), a call a client numbered that never came, a client that ended without its stop,
        or the idle timeout."""
        refused = sum(sum(c.refused.values()) for c in self.counts.values()) + \
            sum(sum(c.values()) for c in self.strangers.values())
        return bool(refused or self.idle_ended or self.receiver.stats.lost or self.receiver.unstopped() or
                    self.receiver.calls.qsize())

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if report.failed:
            self.failed.add(report.nodeid)

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_logstart(self, nodeid: str) -> None:
        if nodeid.startswith("online/"):
            _one_progress_line(self.config, nodeid)

    @pytest.hookimpl(trylast=True)
    def pytest_runtest_logfinish(self, nodeid: str) -> None:
        """pytest wraps its progress line only before the last item, and each online item is the last one
        when it runs: the line is wrapped here, pytest-style, with the count of calls so far."""
        if nodeid.startswith("online/"):
            self.shown += 1
            _wrap_progress(self.config, self.shown)

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
            if self.pool is not None:  # answers in, finished calls reported in arrival order
                full = len(self.pending) >= self.window
                if self._collect(session, 0.1 if full else 0.0):
                    last = time.monotonic()
                if session.shouldfail or session.shouldstop:
                    return
                if full:
                    continue  # the receiver's queue fills meanwhile: clients get BUSY_
            try:
                call = receiver.calls.get(timeout=0.1) if not self.pending else receiver.calls.get_nowait()
            except queue.Empty:
                if self.pending:
                    if self._collect(session, 0.05):
                        last = time.monotonic()
                    continue
                if receiver.finished.is_set() and receiver.calls.empty():
                    return
                self._quiet(time.monotonic() - last)
                if self.idle is not None and time.monotonic() - last > self.idle:
                    self.idle_ended = True
                    receiver.log(f"msprobe online: no call for {self.idle:g} s (msprobe_online_idle): the session "
                                 "ends before every client stopped")
                    return
                continue
            last = time.monotonic()
            self.quiet_said = False
            try:
                data = safeload.load_nfs(bytes(call.body)) if call.nfs else safeload.load_tcp(call.body)
            except safeload.Refused as exc:
                self._refused(call, str(exc))
                continue
            self._accept(call)
            del call
            if isinstance(data, str):  # an nfs marker read as a call file
                continue
            counts = self.rank(data.rank)
            counts.received += 1
            item = self._item(session, data, counts)
            del data
            if item is None:
                continue
            self.pending.append(item)
            if self.pool is not None and item.preset is None:
                self.pool.submit(item, item.path, item.name)
            elif self.pool is None:
                self._report(session)
            if session.shouldfail or session.shouldstop:
                return

    def _refused(self, call: Any, reason: str) -> None:
        """A body the unpickler refused: a client's counts for its rank; else held apart under its peer (a
        connection that never sent an accepted call is not a rank), until it is accepted."""
        if self.receiver.is_client(call):
            counts = self.rank(call.rank)
            counts.received += 1
            counts.refused[reason] += 1
        else:
            self.strangers.setdefault(call.peer, Counter())[reason] += 1
            shown = sum(sum(c.values()) for c in self.strangers.values())
            if shown > STRANGER_LINES:  # a flood of them: counted in the summary, not each printed
                if shown == STRANGER_LINES + 1:
                    self.receiver.log(f"msprobe online: more than {STRANGER_LINES} bodies refused from connections "
                                      "that are not clients: the rest are counted in the summary, not shown")
                return
        self.receiver.log(f"msprobe online: {call.peer} sequence {call.sequence}: refused: {reason}")

    def _accept(self, call: Any) -> None:
        """A call loaded: its connection is a client, and what it sent before that was refused is its rank's."""
        self.receiver.accept(call)
        held = self.strangers.pop(call.peer, None)
        if held:
            counts = self.rank(call.rank)
            counts.received += sum(held.values())
            counts.refused.update(held)

    def _quiet(self, quiet: float) -> None:
        """After QUIET_S without a call, say once (per quiet spell) who the session waits for and how to end it."""
        if self.quiet_said or quiet < QUIET_S:
            return
        self.quiet_said = True
        hint = (f"-o msprobe_online_idle={self.idle:g} ends the session after that long without a call" if self.idle
                else "-o msprobe_online_idle=SECONDS would end it after that long without a call (and fail the run)")
        self.receiver.log(f"msprobe online: no call for {quiet:.0f} s; the clients are quiet. Waiting for: "
                          f"{self.receiver.waiting_for()}. {hint}; Ctrl-C ends it with the results so far")

    def _collect(self, session: pytest.Session, timeout: float) -> bool:
        """Take the workers' answers (waiting up to `timeout`) and report the calls now at the head of the
        arrival order; whether any answer came."""
        answers = self.pool.results(timeout)
        for item, answer in answers:
            item.answer = answer
        self._report(session)
        return bool(answers)

    def _report(self, session: pytest.Session) -> None:
        """Run the items at the head of `pending` whose result is known (all of them in one process)."""
        while self.pending and (self.pool is None or self.pending[0].preset is not None or
                                self.pending[0].answer is not None):
            item = self.pending[0]
            session.items.append(item)
            session.testscollected += 1
            item.config.hook.pytest_runtest_protocol(item=item, nextitem=None)
            self.pending.popleft()
            record = item.stash.get(_record_key(), None)
            assert item.counts is not None
            if (record.status == "SKIP") if record is not None else item.nodeid not in self.failed:
                item.counts.skipped[_reason(record, item.name)] += 1
            else:
                item.counts.checked += 1
            if not self.keep and item.nodeid not in self.failed:
                shutil.rmtree(item.path.parent, ignore_errors=True)
            if session.shouldfail or session.shouldstop:
                return

    def _unreported(self, reason: str) -> None:
        """The calls taken but not reported when the loop ends early are counted, not lost."""
        for item in self.pending:
            if item.counts is not None:
                item.counts.skipped[reason] += 1
        self.pending.clear()

    def _item(self, session: pytest.Session, data: Any, counts: RankCounts) -> OnlineItem | None:
        """The item of a received call, written out as a one-call dump; None when it is not checked (counted)."""
        from ..dump.reader import parse_entry_name
        from ..online import spool
        from ..online.checking import skip_reason

        name = spool.entry_name(data)
        try:
            api = parse_entry_name(name).api_name
        except ValueError as exc:
            counts.refused[str(exc)] += 1
            return None
        reason = self.selection.reason(data.rank, api)
        if reason is not None:
            counts.skipped[reason] += 1
            return None
        parent = self._step(session, data.rank, data.step)
        preset = skip_reason(data, api, self.specs)
        folder = Path(parent.path) / f"{self.order:07d}_{data.name}"
        try:
            dump_json, _ = spool.write(data, folder, tensors=preset is None)
        except (OSError, RuntimeError) as exc:
            counts.refused[f"cannot write the call to {folder}: {exc}"] += 1
            return None
        item = OnlineItem.from_parent(parent, name=name, order=self.order, path=dump_json)
        item.counts = counts
        if preset is not None:
            from ..inputs.seeds import item_seed

            call = name.rsplit(".", 1)[0]
            seed = item_seed(self.config.stash[SETTINGS_KEY].check_options.run_seed, call)
            item.preset = Record(call, "forward", seed, message=preset, device="recorded", mode="replay")
        self.order += 1
        return item

    def _step(self, session: pytest.Session, rank: int, step: int) -> OnlineStep:
        node = self.steps.get((rank, step))
        if node is None:
            nodeid = f"online/rank{rank}/step{step}"
            node = self.steps[(rank, step)] = OnlineStep.from_parent(
                session, name=nodeid, nodeid=nodeid, path=self.spool / f"rank{rank}" / f"step{step}")
        return node

    def _untaken(self) -> list[str]:
        """Calls that arrived whole but were still in the receiver's queue when the session ended (Ctrl-C, -x),
        per rank: never checked, so never silent."""
        calls = self.receiver.calls
        with calls.mutex:
            left = list(calls.queue)
        ranks: dict[str, list[str]] = {}
        for call in left:  # a shared-storage call's rank is known once it is loaded: its file names it
            key = "shared storage" if call.nfs else f"rank{call.rank}"
            ranks.setdefault(key, []).append(call.peer.removeprefix("nfs:") if call.nfs else str(call.sequence))
        return [f"msprobe online: {key}: {len(names)} call(s) arrived but were still queued when the session ended, "
                f"not checked ({'' if key == 'shared storage' else 'sequence '}{listed(names)})"
                for key, names in sorted(ranks.items())]

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
        for peer, reasons in sorted(self.strangers.items()):
            lines.append(f"msprobe online: {peer}: {sum(reasons.values())} body(ies) refused, no call accepted: not a "
                         f"client, not counted in a rank ({reasons.most_common(1)[0][0][:120]})")
        lines += self.receiver.client_lines(idle=self.idle_ended)
        lines += self._untaken()
        stats = self.receiver.stats
        lines += stats.lines[-20:]  # bad peers and refused frames, as logged while they happened
        extra = [f"{k} {v}" for k, v in (("connections", stats.connections), ("CRC errors resent", stats.crc_errors),
                                          ("duplicates dropped", stats.duplicates),
                                          ("calls lost by a client", stats.lost),
                                          ("frames refused unread", stats.refused_frames),
                                          ("connections ended on bad input", stats.dropped),
                                          ("connections closed at the bound", stats.turned_away)) if v]
        if extra:
            lines.append("msprobe online: " + ", ".join(extra))
        if self.idle_ended:
            lines.append(f"msprobe online: ended after {self.idle:g} s without a call, before every client stopped; "
                         f"waiting for: {self.receiver.waiting_for()}")
        elif self.interrupted or not self.receiver.finished.is_set():
            lines.append("msprobe online: interrupted before every client stopped; the results so far are written")
        if self.failed:
            lines.append(f"msprobe online: the failing calls are kept as one-call tensor dumps under {self.spool}")
        return lines


def _start_pool(config: pytest.Config, workers: int) -> Any:
    """The worker processes of msprobe_online_workers, with the items' options (one torch thread each
    unless msprobe_threads says otherwise; the helper thread only where the cores allow), pinned to
    --msprobe-devices in turn as xdist workers are, and msprobe_timeout, past which a busy worker is
    stopped and its call fails."""
    import dataclasses

    from ..online.checking import CheckerPool
    from .devices import child_slots, work_threads

    options = config.stash[SETTINGS_KEY].check_options
    options = dataclasses.replace(options, work_threads=work_threads(options.threads, config, workers))
    value = ini_keys.value(config, "msprobe_timeout")

    return CheckerPool(workers, options, child_slots(config, workers), timeout=float(value) if value else None)


def _one_progress_line(config: pytest.Config, nodeid: str) -> None:
    """The calls of every rank and step share one progress line headed `online `: pytest starts a new line
    (headed by the node's path) whenever the path changes, which, with ranks interleaving, is every call."""
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    writer = getattr(reporter, "_tw", None)
    if reporter is None or writer is None or config.get_verbosity() > 0 or not getattr(reporter, "showfspath", False):
        return
    current = getattr(reporter, "currentfspath", None)
    here = config.rootpath / nodeid.split("::")[0]
    if not (isinstance(current, Path) and current.is_relative_to(config.rootpath / "online")):
        reporter.ensure_newline()
        writer.write("online ")
    reporter.currentfspath = here


def _wrap_progress(config: pytest.Config, calls: int) -> None:
    """End the progress line with ` [N calls]` once it reaches the terminal's edge (pytest's own wrapping
    needs the number of items, which an online session does not know ahead)."""
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    writer = getattr(reporter, "_tw", None)
    if reporter is None or writer is None or config.get_verbosity() > 0:
        return
    message = f" [{calls} calls]"
    if writer.width_of_current_line + len(message) + 1 >= writer.fullwidth:
        failed = bool(reporter.stats.get("failed"))
        writer.write(message + "\n", red=failed, green=not failed)


def _record_key() -> Any:
    from .items import RECORD_KEY

    return RECORD_KEY


def _reason(record: Record | None, name: str) -> str:
    """A skip reason without the call's own name and index, so equal reasons group."""
    message = str(record.message if record is not None and record.message else "skipped")
    call = name.rsplit(".", 1)[0]
    api = call.rsplit(".", 1)[0]
    return message.replace(call, api).splitlines()[0][:160]
