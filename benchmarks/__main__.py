"""`python -m benchmarks NAME [args]`: the benchmarks and dump generators; `python -m benchmarks` lists them."""
from __future__ import annotations

import sys
from pathlib import Path

from evals.entry import main, runnable

HERE = Path(__file__).resolve().parent
# every module of this folder with a `__main__` block is a command, by its file name
COMMANDS = {p.stem: f"benchmarks.{p.stem}" for p in sorted(HERE.glob("*.py")) if p.stem != "__main__" and runnable(p)}

if __name__ == "__main__":
    sys.exit(main("benchmarks", HERE, COMMANDS, sys.argv[1:]))
