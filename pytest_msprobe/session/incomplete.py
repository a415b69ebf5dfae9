"""A run cut short says so: the controller counts the items this session was to run and the ones that reported,
so an interrupted run (Ctrl-C, a kill of a worker, `-x`, xdist giving up on crashed workers) names how many never
ran and the exact command that runs only those (`--msprobe-resume`), and never exits 0. It also keeps a resumed
run's progress monotonic: the journaled items count in pytest's total from the first result on, not only once they
are reported after the run loop."""
from __future__ import annotations

import shlex
from collections.abc import Generator
from typing import Any

import pytest

from . import ini_keys
from .journal import RESUMED_IDS, Journal

PLUGIN_NAME = "msprobe-completeness"


class Completeness:
    """Controller only: what this session was to run (run_items) against what reported (ran)."""

    def __init__(self, config: pytest.Config, journal: Journal) -> None:
        self.config, self.journal = config, journal
        self.session: pytest.Session | None = None
        self.run_items: int | None = None  # API items to run here: collected, less the ones taken from the journal
        self.all_items = 0  # every item to run here (other tests too): pytest's total, for the progress
        self.ran: set[str] = set()  # node ids with a result (a call report, or a setup that did not pass)
        self.stopped: str | None = None  # why the run loop ended early, when it says

    def pytest_sessionstart(self, session: pytest.Session) -> None:
        self.session = session

    @pytest.hookimpl(wrapper=True)
    def pytest_runtestloop(self, session: pytest.Session) -> Generator[None, Any, Any]:
        opt = self.config.option
        if opt.collectonly or getattr(opt, "setuponly", False) or getattr(opt, "setupplan", False):
            return (yield)  # nothing is meant to run
        if not self.config.pluginmanager.hasplugin("dsession"):  # under xdist: collection_finished
            self.count_items([item.nodeid for item in session.items])
        try:
            return (yield)
        finally:
            reason = session.shouldstop or session.shouldfail  # -x, --maxfail, xdist's interrupted worker
            self.stopped = str(reason) if reason else None

    def collection_finished(self, ids: list[str]) -> None:
        """xdist: a worker's collection, which every worker has alike."""
        if not self.config.option.collectonly:
            self.count_items(ids)

    def count_items(self, ids: list[str]) -> None:
        """The items to run: all of them for the progress, the API items for what a cut-short run left out
        (another test suite's items in the same run are pytest's own business)."""
        self.all_items, self.run_items = len(ids), sum(map(is_api_item, ids))
        self.count_resumed()

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        resumed = getattr(report, RESUMED_IDS, None)
        if resumed is not None and not self.journal.resumed:
            self.journal.resumed = {item_id: nodeid for item_id, nodeid in resumed}
        if not getattr(report, "msprobe_resumed", False) and (report.when == "call" or not report.passed) and \
                is_api_item(report.nodeid):
            self.ran.add(report.nodeid)  # an item interrupted in its call has a setup report and no result
        self.count_resumed()  # before pytest's terminal writes this item's progress (at logfinish)

    def count_resumed(self) -> None:
        """pytest's total (the progress percentage's denominator) holds the journaled items as well; xdist resets it
        when a worker (re)collects, so this runs with every report."""
        if self.session is not None and self.run_items is not None and not self.journal.reported:
            self.journal.counted = len(self.journal.resumed)
            self.session.testscollected = self.all_items + self.journal.counted

    def never_ran(self) -> int:
        return 0 if self.run_items is None else max(0, self.run_items - len(self.ran))

    @pytest.hookimpl(tryfirst=True)
    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        if self.never_ran() and session.exitstatus == pytest.ExitCode.OK:
            session.exitstatus = pytest.ExitCode.INTERRUPTED  # not every item was checked: never green

    def lines(self, exitstatus: int | None) -> list[str]:
        """The summary's lines for a run that left items unrun; none for a complete one."""
        missing = self.never_ran()
        if not missing:
            return []
        total = (self.run_items or 0) + len(self.journal.resumed)
        why = "interrupted" if exitstatus == pytest.ExitCode.INTERRUPTED and not self.stopped else \
            f"stopped: {self.stopped}" if self.stopped else "stopped early"
        return [f"NOT COMPLETE ({why}): {missing} of {total} items never ran; the counts and files above hold the "
                f"{total - missing} that have a result",
                f"to run only those and report all {total}: {resume_command(self.config)}"]


def is_api_item(nodeid: str) -> bool:
    """An item of a dump's call (or its [fuzz] twin): its node id names a .json file."""
    return nodeid.split("::", 1)[0].endswith(".json")


def resume_command(config: pytest.Config) -> str:
    """This run's command line with --msprobe-resume (a random seed pinned to the one this run used, whose
    journaled results resume would otherwise not match), former options in their new spelling."""
    from .stash import SETTINGS_KEY

    seed = str(config.stash[SETTINGS_KEY].check_options.run_seed)
    args = ini_keys.respell(str(a) for a in config.invocation_params.args)
    out = []
    for i, arg in enumerate(args):
        if arg == "random" and i and args[i - 1] == "--msprobe-seed":
            arg = seed
        elif arg == "--msprobe-seed=random":
            arg = f"--msprobe-seed={seed}"
        out.append(arg)
    if "--msprobe-resume" not in out:
        out.append("--msprobe-resume")
    return shlex.join(["pytest", *out])

