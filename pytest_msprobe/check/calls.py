"""The steps every flow's runs are made of: one side's call timed (an exception becomes ApiFailure or a skip),
the outputs api_specs says are compared, a side's backward, and the item's statuses from its rows.

Apart from the stages (placement.py, precision.py, execute.py) because rerun, replay and overflow_check items
all call them, whichever stages they have.
"""
from __future__ import annotations

import time
from concurrent.futures import Future
from typing import Any

import torch

from ..inputs.build import InputError
from ..records.record import Record
from ..runs import backends
from ..runs.execution import Device, NotCheckable, backward, pair_cotangents
from ..runs.precision import HF32_BITS, round_mantissa
from ..verdict import standards


class ApiFailure(Exception):
    """The API raised while running; the record keeps the traceback. `side`: "device" for the device's forward or
    backward, else the run that raised."""

    def __init__(self, message: str, side: str = "") -> None:
        super().__init__(message)
        self.side = side


def timed(timings: dict[str, float], key: str, what: str, fn: Any, device: Device | None) -> Any:
    """`fn()` (then `device` synchronised), its time added to `timings[key]`: the one place a run's exception
    becomes the item's error (ApiFailure) or skip."""
    started = time.perf_counter()
    try:
        result = fn()
        if device is not None:
            device.synchronize()
    except (NotCheckable, InputError):
        raise
    except Exception as exc:
        if type(exc).__name__ == "BenchUnsupported":  # bench_functions' own "cannot reproduce this call"
            raise NotCheckable(str(exc)) from None
        raise ApiFailure(f"{what} run raised {type(exc).__name__}: {exc}",
                         "device" if what.startswith("device") else what) from exc
    finally:
        timings[key] = timings.get(key, 0.0) + time.perf_counter() - started  # the twins share a key
    return result


def grad_index(user: dict[str, Any], specs: dict[str, Any], api: str) -> int | None:
    """Which output the recorded gradient belongs to, for an API whose outputs are not all differentiated: the
    user's specs, else api_specs' `backward.grad_index`."""
    index: int | None = user.get("grad_index", specs.get("backward", {}).get("grad_index", {}).get(api))
    return index


def selected(leaves: list[Any], api: str, specs: dict[str, Any]) -> list[Any]:
    """Only the outputs api_specs says are comparable (e.g. attention_out of npu_fusion_attention)."""
    chosen = specs.get("forward_output_index", {}).get(api)
    return leaves if chosen is None else [leaves[i] for i in chosen if i < len(leaves)]


def round_input(value: Any, requires_grad: set[int], bits: int = HF32_BITS) -> Any:
    """An fp32 tensor rounded to HF32 (or `bits` mantissa bits), keeping its place among the inputs that
    require a gradient."""
    if not isinstance(value, torch.Tensor) or value.dtype != torch.float32:
        return value
    rounded = round_mantissa(value, bits)
    if id(value) in requires_grad:
        requires_grad.add(id(rounded))
    return rounded


def same_threads(threads: int) -> None:
    """torch's intra-op threads of this thread set to the items' thread's: a thread torch has not seen starts
    from the machine's default (OMP_NUM_THREADS, else every core), and kernels that size their partial sums by
    it (layer_norm's weight gradient) would round otherwise than on the items' thread."""
    if torch.get_num_threads() != threads:
        torch.set_num_threads(threads)


def bench_raw(future: Future[Any]) -> Any:
    """The bench's result, or its own exception (not the ApiFailure around it), as run_bench would raise it."""
    try:
        return future.result()
    except ApiFailure as failure:
        raise (failure.__cause__ or failure) from None


def backward_seconds(timings: dict[str, float]) -> float:
    """The backward passes' time so far: `compare_s` is the checks alone, the backward passes have their keys."""
    return sum(v for k, v in timings.items() if k.endswith("backward_s"))


def _paired(item: Any, leaves: list[Any]) -> list[Any]:
    """An item's outputs paired with its recorded gradients (source.Item: this module is below it)."""
    pairs = pair_cotangents(leaves, item.inputs.cotangents, item.grad_index)
    if not pairs:
        raise NotCheckable(f"{item.name.full_name}: no differentiable output pairs with a recorded gradient")
    return pairs


def bench_backward(item: Any, leaves_b: list[Any], on: str = "cpu") -> int:
    """The bench's backward (on `on`, msprobe_bench_device) from the recorded gradients paired with its outputs;
    how many were paired."""
    pairs_b = _paired(item, leaves_b)
    timed(item.record.timings, "bench_backward_s", "bench backward", lambda: backward(leaves_b, pairs_b, on), None)
    return len(pairs_b)


def device_backward(item: Any, leaves_d: list[Any]) -> int:
    """The device's backward, inside the device-call boundary; how many outputs were paired."""
    name, device, impl = item.name, item.where.device, item.where.resolved.label
    pairs_d = _paired(item, leaves_d)
    timed(item.record.timings, "device_backward_s", "device backward", lambda: backends.device_call(
        f"{name.full_name}.{name.direction}", f"{name.api_type}.{name.api_name}", "backward", device, impl,
        lambda: backward(leaves_d, pairs_d, device.name)), None)
    return len(pairs_d)


def backward_both(item: Any, leaves_b: list[Any], leaves_d: list[Any]) -> None:
    """Backward of the bench and of the device (overflow_check dumps)."""
    if bench_backward(item, leaves_b) != device_backward(item, leaves_d):
        raise NotCheckable(f"{item.name.full_name}: no differentiable output pairs with a recorded gradient")


def finish_record(record: Record) -> None:
    """The item's statuses from its output rows: Layer 1 alone, and with the standard's verdicts."""
    record.layer1_status = standards.aggregate(row.status for row in record.outputs)
    record.status = standards.aggregate(row.verdict or row.status for row in record.outputs)
    if record.status == "SKIP" and not record.message:
        record.message = "; ".join(row.verdict_message or row.message for row in record.outputs
                                      if row.verdict_message or row.message) or \
            "nothing was compared"


def has_scalar_operand(args: list[Any], kwargs: dict[str, Any]) -> bool:
    """Whether a Python number is among a call's arguments (which a kernel may round otherwise than torch)."""
    return any(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (*args, *kwargs.values()))
