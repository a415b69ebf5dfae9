"""An item's inputs: which entries it checks, and its arguments rebuilt from them (random from the recorded
statistics, or the saved tensors), reproducibly from the item's seed.

With a spare core (CheckOptions.work_threads > 1) the next item's inputs are built in the helper thread
while this item's API runs (`prefetch`); they are the same values, since every draw comes from the item's
own seed. The item hands that build over once its own sides are made, just before its device run
(`prefetch_later`, `start_prefetch`): the sides' copies take and drop the GIL once per tensor, and with the
helper thread building inputs in Python beside them each copy waited for the GIL, whereas the API runs
drop it for milliseconds at a time.
"""
from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, NamedTuple

import torch

from ..dump.reader import Dump, parse_entry_name
from ..helper import Stopped, helper
from ..inputs.build import BuildContext, build, parse_dtype
from ..inputs.seeds import item_seed
from ..runs.execution import NotCheckable, output_leaves
from ..runs.terms import FORMS
from ..settings import CheckOptions
from ..specs.loader import api_settings, in_list
from ..verdict import contracts
from .precision import Inputs
from .source import Item

Built = tuple[BuildContext, list[Any], dict[str, Any], list[Any]]


class _Key(NamedTuple):
    """What a build depends on (the dump and specs by identity: one object each per process)."""
    dump: int
    api: str  # the full name, e.g. Functional.linear.3
    backward: bool
    seed: int
    options: CheckOptions
    specs: int


# each build's future and the build itself (to run it elsewhere), which holds the dump and specs: their ids stay theirs
_pending: dict[_Key, tuple[Future[Built], Callable[[], Built]]] = {}


_later: list[Callable[[], None]] = []  # the running item's hand-over of the next item's build (items' thread)


def prefetch_later(start: Callable[[], None] | None) -> None:
    """`start` (which calls `prefetch` for the next item) runs at `start_prefetch`, when the item that runs now
    has made its sides; None forgets a hand-over that did not happen (an item skipped before its runs)."""
    _later[:] = [] if start is None else [start]


def start_prefetch() -> None:
    """The running item's sides are made: start building the next item's inputs (check flows call this just
    before the device run; nothing happens where no item handed a build over)."""
    while _later:
        _later.pop()()


def prefetch(dump: Dump, entry_name: str, options: CheckOptions, specs: dict[str, Any]) -> None:
    """Start building `entry_name`'s inputs in the helper thread, when a core is spare and the entry is
    re-run from a PyTorch dump. The item that runs now may still take its own; older ones are dropped.
    A problem is left for the item to report."""
    while len(_pending) > 1:
        del _pending[next(iter(_pending))]
    if options.work_threads < 2 or options.mode == "replay" or dump.framework != "pytorch":
        return
    try:
        name = parse_entry_name(entry_name)
        _, forward, backward_entry = checkable_entries(dump, name, specs)
    except (ValueError, NotCheckable):
        return
    try:
        args_enc, kwargs_enc = encoded_arguments(forward, name.full_name)
    except NotCheckable:
        return
    seed = item_seed(options.run_seed, name.full_name)
    key = _Key(id(dump), name.full_name, backward_entry is not None, seed, options, id(specs))
    one_thread = dataclasses.replace(options, work_threads=1)  # it runs in the helper thread already
    inputs = functools.partial(build_inputs, Build(dump, name.api_name, args_enc, kwargs_enc, backward_entry, seed,
                                                   _real(dump, options), one_thread, specs))
    _pending[key] = (helper().submit(inputs), inputs)


def build_pending_here() -> None:
    """Build the next item's inputs in this thread where the helper has not started them: the items' thread
    calls it when it would otherwise wait for the helper (the bench beside it), which then goes on to this item's
    metrics sooner. The same inputs: the build depends only on the item."""
    for key, (future, inputs) in list(_pending.items()):
        if not future.cancel():
            continue
        here: Future[Built] = Future()
        try:
            here.set_result(inputs())
        except Exception as exc:  # left for the item to report, as a build in the helper's would be
            here.set_exception(exc)
        _pending[key] = (here, inputs)


def _taken(key: _Key) -> Future[Built] | None:
    """The build started for this item, unless Ctrl-C stopped it (an in-process session that goes on builds again)."""
    found = _pending.pop(key, None)
    if found is None or found[0].cancelled() or (found[0].done() and isinstance(found[0].exception(), Stopped)):
        return None
    return found[0]


def _real(dump: Dump, options: CheckOptions) -> bool:
    return options.data_mode == "real" or (options.data_mode == "auto" and dump.is_real_data)


def checkable_entries(dump: Dump, name: Any, specs: dict[str, Any]) -> tuple[Any, dict[str, Any], Any]:
    """(the user's per-API settings, forward entry, backward entry or None), or NotCheckable when
    the API is skipped by api_specs or the user's spec file, or its entries are missing."""
    for group in ("always_skip", "random_apis"):
        if in_list(specs, name.api_name, group):
            raise NotCheckable(f"{name.full_name}: {specs[group]['reason']}")
    user = api_settings(specs, name.api_name)
    if user.get("skip"):
        raise NotCheckable(f"{name.full_name}: {user['skip']} (msprobe_specs)")
    forward = entry_of(dump, name.full_name, "forward")
    backward_entry = entry_of(dump, name.full_name, "backward") if name.direction == "backward" else None
    return user, forward, backward_entry


def encoded_arguments(forward: dict[str, Any], full: str) -> tuple[list[Any], dict[str, Any]]:
    """The forward entry's recorded input_args and input_kwargs, or NotCheckable when they are malformed."""
    args_enc, kwargs_enc = forward.get("input_args") or [], forward.get("input_kwargs") or {}
    if not isinstance(args_enc, list) or not isinstance(kwargs_enc, dict):
        raise NotCheckable(f"{full}: input_args must be a list and input_kwargs an object")
    return args_enc, kwargs_enc


def entry_of(dump: Dump, full: str, direction: str) -> dict[str, Any]:
    entry = dump.entry(f"{full}.{direction}")
    if entry is None:
        raise NotCheckable(f"no {direction} entry {full}.{direction} in the dump")
    if not isinstance(entry, dict):
        raise NotCheckable(f"entry {full}.{direction} is a {type(entry).__name__}, expected an object")
    return entry


def prepared_inputs(item: Item) -> Inputs:
    """An item's build_inputs from the record's seed and the data mode (built ahead, where a core was spare), with
    msprobe's CPU dtype conversions; the record gets the input notes and where the data came from."""
    dump, api, record, options, specs = item.dump, item.name.api_name, item.record, item.options, item.specs
    args_enc, kwargs_enc, backward_entry = item.args_enc, item.kwargs_enc, item.backward_entry
    key = _Key(id(dump), record.api, backward_entry is not None, record.seed, options, id(specs))
    built = _taken(key)
    ctx, args, kwargs, cotangents = built.result() if built is not None else build_inputs(Build(
        dump, api, args_enc, kwargs_enc, backward_entry, record.seed, _real(dump, options), options, specs))
    args, kwargs = preprocess(api, args, kwargs, specs, ctx.requires_grad)
    record.notes += ctx.notes
    record.data = "real" if ctx.loaded_files else "random"
    return Inputs(args, kwargs, cotangents, ctx.requires_grad)


class Build(NamedTuple):
    """What a call's inputs are built from: its encoded arguments and backward entry, the item's seed, whether
    saved tensors are read (`real`), the settings and the specs (`api`: the name the specs know it by)."""

    dump: Dump
    api: str
    args_enc: list[Any]
    kwargs_enc: dict[str, Any]
    backward_entry: Any
    seed: int
    real: bool
    options: CheckOptions
    specs: dict[str, Any]


def build_inputs(request: Build) -> Built:
    """The call's arguments (and, for a backward item, the recorded cotangents), reproducibly from its seed."""
    dump, api, args_enc, kwargs_enc, backward_entry, seed, real, options, specs = request
    ctx = BuildContext(dump, torch.Generator().manual_seed(seed), real,
                       options.max_tensor_bytes or int(specs.get("max_tensor_bytes", 4 << 30)),
                       threads=options.work_threads)
    args = []
    for i, enc in enumerate(args_enc):
        ctx.clamp_min_zero = i == 1 and in_list(specs, api, "preprocess", "clamp_min_zero_arg1")
        args.append(build(enc, ctx, f"input_args.{i}"))
    ctx.clamp_min_zero = False
    kwargs = {k: build(v, ctx, f"input_kwargs.{k}", kwarg=k) for k, v in kwargs_enc.items()}
    cotangents: list[Any] = []
    if backward_entry is not None:
        grad_ctx = BuildContext(dump, torch.Generator().manual_seed(seed + 1), real, ctx.max_bytes,
                               threads=options.work_threads)
        raw = backward_entry.get("input")
        cotangents = output_leaves([build(c, grad_ctx, f"backward.input.{i}")
                                    for i, c in enumerate(raw if isinstance(raw, list) else [raw])])
    return ctx, args, kwargs, cotangents


def preprocess(api: str, args: list[Any], kwargs: dict[str, Any], specs: dict[str, Any],
               requires_grad: set[int]) -> tuple[list[Any], dict[str, Any]]:
    """msprobe's dtype conversions for CPU kernels: `convert` (int32 targets -> int64) and
    `preprocess.int_input_to_float` (an integer first argument of histc -> float32, any integer dtype)."""
    conversions = []
    for rule in specs.get("convert", {}).values():
        if api in rule.get("apis", []):
            conversions.append((parse_dtype(rule["from"]), parse_dtype(rule["to"])))
    to_float = in_list(specs, api, "preprocess", "int_input_to_float") and bool(args) and \
        isinstance(args[0], torch.Tensor) and not args[0].is_floating_point() and not args[0].is_complex() \
        and args[0].dtype != torch.bool
    if not conversions and not to_float:
        return args, kwargs

    def convert(v: Any, dst: torch.dtype | None = None) -> Any:
        if isinstance(v, torch.Tensor):
            for src, to in conversions if dst is None else [(v.dtype, dst)]:
                if v.dtype == src:
                    new = v.to(to)
                    if id(v) in requires_grad:
                        requires_grad.add(id(new))
                    return new
        return v

    args = [convert(a) for a in args]
    if to_float:
        args[0] = convert(args[0], torch.float32)
    return args, {k: convert(v) for k, v in kwargs.items()}


def recorded_device(options: CheckOptions, saved_on: set[str]) -> tuple[str, str]:
    """The device type that recorded a replayed call's outputs, and how that is known: the option, else
    the device its saved tensors were on (msprobe saves them where they were), else Ascend's npu,
    which msprobe assumes (MindSpore's .npy files and statistics do not tell)."""
    if options.recorded_on != "auto":
        return options.recorded_on, "msprobe_recorded_on"
    devices = sorted(d for d in saved_on if d != "cpu") or sorted(saved_on)
    if devices:
        return devices[0], "the device of its saved tensors"
    return "npu", "assumed: the dump does not tell"


def replay_contract(options: CheckOptions, mode: str, saved_on: set[str]) -> str:
    """The accuracy contract of recorded outputs: the recording device's vendor's where the option or the saved
    tensors say which it was; torch's own where the device is only assumed, or MindSpore ran here."""
    recorded_on, told = recorded_device(options, saved_on)
    return contracts.resolve(options.contract, "cpu" if mode == "rerun" or told.startswith("assumed") else recorded_on)


def terms_scale(options: CheckOptions, contract: str, api: str, specs: dict[str, Any], args: list[Any],
                want_grad: bool) -> float | None:
    """The contract's ULP bound of a call it bounds relative to the terms of a sum the call cancels in (gelu, silu's
    gradient under `cuda`: runs/terms.py), or None."""
    x = args[0] if args else None
    if options.standard != "strict" or api not in FORMS or not isinstance(x, torch.Tensor) or \
            not contracts.cancels(specs, contract, api, want_grad):
        return None
    allowance = contracts.bound(specs, contract, api, str(x.dtype), want_grad)
    return None if allowance is None else allowance[0]
