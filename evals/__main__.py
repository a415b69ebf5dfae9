"""`python -m evals NAME [args]`: the evaluation suites' scripts; `python -m evals` lists them."""
from __future__ import annotations

import sys
from pathlib import Path

from evals.entry import main

COMMANDS = {
    "planted_bugs": "evals.planted_bugs",
    "planted_fused": "evals.planted_fused",
    "accelerator": "evals.planted.accelerator.self_check",
    "fused_dump": "evals.planted.fused_dump",
    "controller_probe": "evals.probes.controller_probe",
    "recorded_replay": "evals.recorded_replay",
    "in_training": "evals.in_training",
}

if __name__ == "__main__":
    sys.exit(main("evals", Path(__file__).resolve().parent, COMMANDS, sys.argv[1:]))
