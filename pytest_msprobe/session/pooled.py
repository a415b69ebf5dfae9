"""Pooled items on the controller: after every call was checked (or resumed), the calls of one API that each
passed alone are judged together (verdict/pooled.py), and each pool that fails is reported as one failed item
through the hooks a run uses (terminal, short summary, JUnit, --lf cache, exit status)."""
from __future__ import annotations

import pytest

from ..records.record import Record
from .stash import SETTINGS_KEY


def report(config: pytest.Config, session: pytest.Session, records: list[Record]) -> list[Record]:
    """Report the failing pools of `records`; their records, for the result files."""
    if not any(r.standard == "strict" for r in records):
        return []
    from ..specs.loader import load_specs
    from ..verdict import pooled
    from .items import log_report

    specs = load_specs(user_file=config.stash[SETTINGS_KEY].check_options.specs_file)
    out = pooled.failed_records(records, specs)
    for record in out:
        nodeid = str(record.nodeid)
        location = (nodeid.rpartition("::")[0], 0, f"msprobe: {nodeid.rpartition('::')[2]}")
        log_report(config.hook, pytest.TestReport(nodeid, location, {"msprobe": 1}, "failed", record.message, "call"))
    session.testscollected += len(out)
    return out
