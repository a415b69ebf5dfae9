"""pytest-msprobe: every API call of an msprobe dump.json becomes a pytest item.

The tree is the pipeline; a subpackage imports only those before it (tests/test_layout.py holds the order):

    dump/ -> specs/ -> inputs/ -> runs/ -> metrics/ -> verdict/   the stages of one call's check
    check/    one entry through those stages into its record (check.check_entry)
    reports/  records -> msprobe's CSVs, JSON lines, terminal lines
    triage/   from a red record to a fix: error data, repro scripts, the HTML page
    online/   calls streamed from a running training job into the same check
    session/  the pytest layer (plugin.py registers it); nothing before it imports pytest
    records/  below them all: the record's vocabulary (columns, file headers, the form records travel in)

Importing the package imports nothing else: the plugin loads torch and numba on the first item.
"""
from __future__ import annotations

__version__ = "0.1.0"
