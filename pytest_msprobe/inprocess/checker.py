"""`Checking`: the context manager (and decorator) `pytest_msprobe.checking(...)` returns.

While it is entered, the capture (online/capture.py) hands every selected call of the step to `_seen`, in the
step's own thread: the call is numbered per API as msprobe numbers it, sampled (`sample`: one in N per API),
given its bytes in the budget (inprocess/queue.py) and copied to the host once; the feeder thread
(inprocess/feeder.py) takes it from there. On exit every call's record is in, the files are written
(inprocess/outputs.py) and one summary line says what was checked; a failing or unchecked call then raises
`CheckFailed`, unless an exception of the step's own is already on its way out.
"""
from __future__ import annotations

import contextlib
import os
import sys
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ..online.capture import Capture, in_place, plain_kwargs
from ..online.safeload import ApiData
from ..records.record import Record
from ..runs.leaves import map_structure, tensors_of
from ..settings import CheckOptions, Settings
from . import outputs
from .feeder import Captured, Feeder, not_checked
from .queue import Budget, Calls
from .selection import Selection

WHEN_FULL = ("wait", "skip")
KEEP = ("failed", "all", "none")


class CheckFailed(AssertionError):
    """A checked block had calls that failed or were not checked; `summary` is the closing line."""

    def __init__(self, summary: outputs.Summary) -> None:
        super().__init__(summary.line)
        self.summary = summary


@dataclass(frozen=True)
class Options:
    """`checking()`'s keywords (docs/how-to/check-a-training-step.md)."""

    out: str | Path = "msprobe_inprocess"
    apis: Sequence[str] | None = None  # msprobe's `list`: full call names, or parts of API names
    sample: int = 1  # check one call in N of each API
    workers: int = 2  # worker processes that check
    level: str = "api"  # api: the names msprobe dumps; aten: aten ops, as online_dispatch saw them
    backward: bool = True  # see the step's backward (as aten ops)
    queue_bytes: int = 2 << 30  # tensor bytes captured and not yet checked, at most
    when_full: str = "wait"  # wait: the step waits for room; skip: the call is counted as not checked
    keep: str | Sequence[str] = "failed"  # which calls stay as a tensor dump: failed, all, none, or these APIs
    device: str | None = None  # what the step runs on (its contract); None: the first call's tensors say
    standard: str = "strict"
    rank: int | None = None
    step: int = 0
    timeout: float | None = None  # seconds one call's check may take in a worker
    fail: bool = True  # raise CheckFailed on exit when a call failed or was not checked
    quiet: bool = False  # no summary line on stderr

    def __post_init__(self) -> None:
        problems = []
        for key in ("sample", "workers"):
            value = getattr(self, key)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                problems.append(f"{key}={value!r}: a positive whole number")
        if self.when_full not in WHEN_FULL:
            problems.append(f"when_full={self.when_full!r}: one of {', '.join(WHEN_FULL)}")
        if isinstance(self.keep, str) and self.keep not in KEEP:
            problems.append(f"keep={self.keep!r}: one of {', '.join(KEEP)}, or a list of API names")
        if problems:
            raise ValueError("checking(): " + "; ".join(problems))


class Checking(contextlib.ContextDecorator):
    """One checked block: `with checking(...) as c: ...`, `c.step()` between training steps."""

    def __init__(self, options: Options) -> None:
        self.options = options
        self.selection = Selection(options.apis)
        self.capture = Capture(self._seen, backward=options.backward, level=options.level, wants=self._wanted,
                               copy=host_copy)
        self.summary: outputs.Summary | None = None

    def __enter__(self) -> Checking:
        o = self.options
        self.out = Path(o.out)
        self.current_step, self.rank = o.step, _rank(o.rank)
        self.counters: defaultdict[str, int] = defaultdict(int)
        self.call_name = ""  # the call `_wanted` took last, which `_seen` gets next
        self.seen = self.sampled_out = 0
        self.unsent: dict[int, Record] = {}  # calls the budget refused
        self.budget, self.calls = Budget(o.queue_bytes), Calls()
        self.base = CheckOptions(device="cpu", mode="replay", standard=o.standard, recorded_on=o.device or "auto")
        self.feeder = Feeder(self.calls, self.budget, self.out, self.base, o.workers,
                             keep=outputs.keeper(o.keep), timeout=o.timeout)
        self.feeder.start()
        self.capture.__enter__()
        return self

    def __exit__(self, kind: Any, value: Any, tb: Any) -> None:
        self.capture.__exit__(kind, value, tb)
        self.calls.close()
        self.feeder.join()
        records = {**self.feeder.records, **self.unsent}
        # the workers' options (told the recording device by the first call), for the page and the replay line
        settings = Settings(check_options=self.feeder.options or self.base, standard=self.options.standard)
        self.summary = outputs.write(self.out, [records[k] for k in sorted(records)], self.feeder.kept,
                                     self.sampling(), settings)
        if kind is None and self.options.fail and not self.summary.ok:
            raise CheckFailed(self.summary)  # its message is the summary
        if not self.options.quiet:
            print(self.summary.line, file=sys.stderr)

    def step(self) -> None:
        """Start the next training step: msprobe numbers each step's calls from 0."""
        self.current_step += 1
        self.counters.clear()

    def sampling(self) -> outputs.Sampling:
        return outputs.Sampling(self.seen + self.sampled_out, self.sampled_out, self.options.sample)

    # ------------------------------------------------------------------ the step's thread
    def _wanted(self, api: str) -> bool:
        """Whether this call of `api` is checked: numbered per API, selected and sampled before it runs, so that
        an in-place call the sample leaves out is not copied for nothing. The capture hands the wanted call to
        `_seen` next, under the name kept in `call_name`."""
        if not self.selection.wants_api(api):
            return False
        index = self.counters[api]
        self.counters[api] += 1
        self.call_name = f"{api}.{index}"
        if index % self.options.sample or not self.selection.wants_call(self.call_name):
            self.sampled_out += 1
            return False
        return True

    def _seen(self, api: str, args: Any, kwargs: Any, out: Any) -> None:
        name = self.call_name
        sequence, self.seen = self.seen, self.seen + 1
        kwargs = plain_kwargs(kwargs)
        nbytes = tensor_bytes([args, kwargs, out])
        if not self.budget.reserve(nbytes, wait=self.options.when_full == "wait"):
            why = f"the queue was full ({self.budget.held} of queue_bytes={self.options.queue_bytes} held)"
            self.unsent[sequence] = outputs.placed(not_checked(name, why, status="SKIP"), self.out, self.current_step,
                                                   self.rank)
            return
        # an in-place call's arguments are the host copies the capture made before it ran
        inputs = list(args) if in_place(api.rsplit(".", 1)[-1]) else host_copy(list(args))
        call = ApiData(name, inputs, host_copy(kwargs), host_copy(out), self.current_step, self.rank)
        self.calls.put(Captured(sequence, call, nbytes, api, device_type([args, out])))


def tensor_bytes(value: Any) -> int:
    return sum(t.numel() * t.element_size() for t in tensors_of(value))


SHARED_FROM = 1 << 16  # bytes: a tensor this large is copied straight into shared memory


def host_copy(value: Any) -> Any:
    """The value with each tensor copied to the host once (the step may change its own right after). A large
    one is copied into shared memory, which the worker then maps: no second copy to send it, and its pages
    go back to the system when it is checked (the process's heap would keep them)."""
    return map_structure(_host_tensor, value)


def _host_tensor(value: Any) -> Any:
    if not isinstance(value, torch.Tensor):
        return value
    copy = _shared_copy(value) if value.numel() * value.element_size() >= SHARED_FROM and \
        value.layout == torch.strided else value.detach().to("cpu", copy=True)
    return copy.requires_grad_() if value.requires_grad else copy  # the dump says which inputs had gradients


def _shared_copy(value: torch.Tensor) -> torch.Tensor:
    storage = torch.UntypedStorage._new_shared(value.numel() * value.element_size())  # type: ignore[no-untyped-call]  # unannotated in torch
    return torch.empty(0, dtype=value.dtype).set_(storage).view(value.shape).copy_(value.detach())


def device_type(value: Any) -> str:
    """The accelerator a tensor in value is on (cuda, npu), else cpu."""
    return next((t.device.type for t in tensors_of(value) if t.device.type in ("cuda", "npu")), "cpu")


def _rank(rank: int | None) -> int:
    return int(os.environ.get("RANK", "0")) if rank is None else rank
