"""`PtdbgDispatch`: msprobe's in-training comparison (`msprobe.pytorch.online_dispatch`, mindstudio-probe 8.3 and
earlier) with its arguments, checked by this project's protocol instead of run_ut's Layer-1 thresholds.

    with PtdbgDispatch(dump_mode="auto", dump_path="/data/dispatch"):
        out = model(x)

As msprobe's, it sees aten ops (`level="aten"`), writes under `<dump_path>/msprobe_[<tag>_]rank<r>_<time>/`
(dump_path must exist) and never raises for a failing op: the CSVs and the summary line say so. The mapping
of each argument, and what differs, is in docs/how-to/from-msprobe.md.
"""
from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any

from .checker import Checking, Options

DUMP_MODES = ("all", "list", "auto", "OFF")  # msprobe's Const.ONLINE_DUMP_MODE
KEEP = {"all": "all", "auto": "failed", "OFF": "none"}


class DispatchError(ValueError):
    """An argument msprobe's PtdbgDispatch would refuse; the message names it."""


def folder_name(tag: str | None, rank: int) -> str:
    """msprobe's folder: `msprobe_rank<r>_<YYYYmmddHHMMSS><ms>`, with `<tag>_` before `rank` when tagged."""
    now = time.time()
    stamp = time.strftime("%Y%m%d%H%M%S", time.localtime(now)) + f"{int(now * 1000) % 1000:03d}"
    return f"msprobe_{tag}_rank{rank}_{stamp}" if tag else f"msprobe_rank{rank}_{stamp}"


def aten_names(api_list: list[str]) -> list[str]:
    """The entries of api_list that are aten ops, as `Aten.<op>`; msprobe drops the others with a warning."""
    import torch

    known = set(dir(torch.ops.aten))
    for name in api_list:
        if name not in known:
            print(f"msprobe dispatch: {name} is not an aten op and is not dumped (see torch.ops.aten)", file=sys.stderr)
    return [f"Aten.{name}" for name in api_list if name in known]


def PtdbgDispatch(dump_mode: str = "OFF", api_list: list[str] | None = None, debug: bool = False,  # noqa: N802
                  dump_path: str | None = None, tag: str | None = None, process_num: int = 0) -> Checking:
    """A checked block with msprobe's arguments: every aten op is checked; dump_mode says which stay on disk as a
    tensor dump (all, list: api_list's and the failing ones, auto: the failing ones, OFF: none); process_num
    worker processes check (0: one, since a check never runs in the training process here)."""
    if dump_mode not in DUMP_MODES:
        raise DispatchError(f'dump_mode={dump_mode!r}: one of {", ".join(DUMP_MODES)}')
    if not isinstance(api_list or [], list) or not all(isinstance(a, str) for a in api_list or []):
        raise DispatchError(f"api_list={api_list!r}: a list of aten op names")
    if not isinstance(debug, bool):
        raise DispatchError(f"debug={debug!r}: True or False")
    if not isinstance(process_num, int) or isinstance(process_num, bool) or process_num < 0:
        raise DispatchError(f"process_num={process_num!r}: a whole number, 0 or more")
    if tag is not None and not isinstance(tag, str):
        raise DispatchError(f"tag={tag!r}: a string")
    if dump_path is None:
        raise DispatchError("dump_path is required (msprobe's PtdbgDispatch asks for it too)")
    if not Path(dump_path).is_dir():
        raise DispatchError(f"dump_path={dump_path!r}: no such folder (msprobe requires it to exist)")
    rank = int(os.environ.get("RANK", "0"))
    keep: Any = KEEP.get(dump_mode) or aten_names(api_list or []) or "failed"
    out = Path(dump_path).resolve() / folder_name(tag, rank)
    return Checking(Options(out=out, level="aten", keep=keep, workers=max(1, process_num), rank=rank, fail=False,
                            quiet=False))
