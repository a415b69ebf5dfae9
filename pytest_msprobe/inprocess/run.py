"""`python -m pytest_msprobe run [options] train.py [args]`: a training script run as itself, with every call
checked in-process. The status is the script's own when it fails, else 1 when any call failed or was not
checked, else 0: a CI job can gate on it without editing the script."""
from __future__ import annotations

import runpy
import sys
from pathlib import Path

from .checker import Checking, Options


def run_script(script: Path, argv: list[str], options: Options) -> int:
    if not script.is_file():
        print(f"error: {script}: no such script", file=sys.stderr)
        return 2
    checker = Checking(options)
    saved_argv, saved_path = sys.argv, list(sys.path)
    sys.argv = [str(script), *argv]
    sys.path.insert(0, str(script.resolve().parent))  # as `python train.py` puts the script's folder first
    try:
        with checker:
            runpy.run_path(str(script), run_name="__main__")
    except SystemExit as exc:  # the script's own exit: its status stands when it is a failure
        if exc.code not in (None, 0):
            return exc.code if isinstance(exc.code, int) else 1
    finally:
        sys.argv, sys.path[:] = saved_argv, saved_path
    assert checker.summary is not None
    return 0 if checker.summary.ok else 1
