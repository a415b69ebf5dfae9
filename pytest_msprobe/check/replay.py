"""Items whose device result is not a local torch run: replay of recorded outputs, and MindSpore dumps.

* **replay** (`--msprobe-mode replay`; the default for MindSpore tensor dumps): the device result is
  what the dump saved (`output`, and for backward items `backward.output`), and the bench is PyTorch
  on CPU in raised precision from the saved inputs. Nothing runs on a device, so a dump copied from an
  NPU host (PyTorch or MindSpore) is checked on any CPU machine, without torch_npu or MindSpore.
* **MindSpore re-run**: the recorded `Mint`/`MintFunctional`/`Tensor` call runs again in MindSpore
  (mindspore.py) from inputs generated or loaded exactly as for PyTorch items.

Backward replay compares a recorded gradient only with the bench gradient of the same role:
* PyTorch dumps: msprobe records the gradients that flow out of the API output's autograd node, in
  the node's input order (`linear` is `AddmmBackward0`: bias, input, weight.t(); `cross_entropy` is
  `NllLossBackward0`: the gradient w.r.t. the log-softmax). The bench hooks the same node of its own
  graph, so slot j is compared with slot j, shapes checked; if the node's layout differs from what
  was recorded, nothing is compared and the item says why.
* MindSpore dumps: gradients are recorded in argument order (one per positional tensor argument);
  they are matched by position and checked by shape.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import torch

from ..dump.reader import Dump, EntryName
from ..inputs.build import TENSOR_TYPES, BuildContext, InputError, _load_saved, _shape, build, parse_dtype
from ..metrics.vectorised import blank_metrics
from ..runs import capture, mindspore
from ..runs.backends import select as select_device
from ..runs.execution import (
    RAISABLE,
    Device,
    NotCheckable,
    backward,
    make_side,
    output_leaves,
    pair_cotangents,
    plan_precision,
    resolve,
    run_side,
    seed_random_apis,
    tensors_of,
)
from ..runs.third_run import ReferenceRun, third_run
from ..settings import CheckOptions
from ..specs.loader import api_settings, in_list
from ..verdict import ms_results
from ..verdict.standards import OutputComparison
from . import compare, prepare
from . import rerun as check

_TRANSPOSES = ("TBackward0", "TransposeBackward0", "TransposeBackward1", "PermuteBackward0")


def effective_mode(dump: Dump, options: CheckOptions) -> str:
    """`replay` or `rerun` for this dump. auto: replay MindSpore tensor dumps (as msprobe's checker
    does: the device result is what the dump saved), re-run everything else."""
    if options.mode != "auto":
        return options.mode
    if dump.framework != "pytorch" and dump.is_real_data and options.data_mode != "random":
        return "replay"
    return "rerun"


@dataclass(frozen=True)
class Unsaved:
    """A recorded tensor the dump has no file for: reported as a SKIP row, never compared."""

    where: str
    shape: tuple[int, ...]


def run_external(dump: Dump, name: EntryName, options: CheckOptions, specs: dict[str, Any],
                 record: dict[str, Any]) -> None:
    """check._run for replay mode and for MindSpore dumps; fills `record` the same way."""
    mode = effective_mode(dump, options)
    framework = dump.framework
    ms_dump = framework == "mindspore"
    record["mode"] = mode
    if framework != "pytorch":
        record["framework"] = framework
    full, api = name.full_name, name.api_name
    reason = specs.get("unsupported_types", {}).get(name.api_type)
    if reason:
        raise NotCheckable(f"{full}: {reason}")
    if mode == "replay" and not dump.is_real_data:
        raise NotCheckable(f"--msprobe-mode replay compares the outputs a tensor dump saved; this is a "
                           f"{dump.task or 'statistics'} dump without dump_tensor_data/")
    if mode == "rerun" and framework not in ms_results.MS_FRAMEWORKS:
        raise NotCheckable(f"{framework} dumps are checked in replay mode only (re-running needs {framework})")
    forward = prepare.entry_of(dump, full, "forward")
    backward_entry = prepare.entry_of(dump, full, "backward") if name.direction == "backward" else None
    want_grad = backward_entry is not None
    args_enc, kwargs_enc = forward.get("input_args") or [], forward.get("input_kwargs") or {}

    # the bench: PyTorch on CPU (through the MindSpore -> torch table for MindSpore dumps)
    if ms_dump:
        twin = mindspore.torch_twin(name.api_type, api, specs)
        bench_fn, bench_label, bare = twin.fn, twin.label, twin.api
        for group in ("always_skip", "random_apis"):
            if bare != api and in_list(specs, bare, group):
                raise NotCheckable(f"{full} ({bench_label}): {specs[group]['reason']}")
    else:
        resolved = resolve(name.api_type, api, Device("cpu"), specs, forward)
        bench_fn, bench_label, bare = resolved.bench_fn, resolved.label, api
    user = {**api_settings(specs, api), **api_settings(specs, bare)}
    if user.get("skip"):
        raise NotCheckable(f"{full}: {user['skip']} (--msprobe-specs)")
    ms_call = None
    if mode == "rerun":
        ms_call = mindspore.ms_callable(name.api_type, api, specs, options.device, options.device_index, framework)
        record["device"], record["impl"] = f"mindspore:{ms_call.target}", f"{ms_call.label} (bench {bench_label})"
    else:
        record["device"], record["impl"] = "recorded", f"outputs saved in the dump (bench {bench_label})"

    started = time.perf_counter()
    real = mode == "replay" or options.data_mode == "real" or (options.data_mode == "auto" and dump.is_real_data)
    if mode == "replay":
        _require_saved(full, args_enc, "input_args")
        _require_saved(full, kwargs_enc, "input_kwargs")
        if backward_entry is not None:
            _require_saved(full, backward_entry.get("input"), "backward.input")
    ctx, args, kwargs, cotangents = prepare.build_inputs(dump, bare, args_enc, kwargs_enc, backward_entry,
                                                       record["seed"], real, options, specs)
    by_position = ms_dump or ms_call is not None  # MindSpore's gradients: one per positional tensor argument
    if by_position and (ms_dump or not ctx.requires_grad):  # no requires_grad recorded: every float tensor (§7.4)
        ctx.requires_grad.update(id(t) for t in tensors_of(args) if t.is_floating_point())
    bench_args, bench_kwargs = prepare.preprocess(bare, args, kwargs, specs, ctx.requires_grad)
    max_bytes = ctx.max_bytes
    record["notes"] += ctx.notes
    record["data"] = "real" if ctx.loaded_files else "random"
    record["contract"] = prepare.replay_contract(options, mode, ctx.devices)

    plan = plan_precision(bare, bench_args, bench_kwargs, _output_dtype(forward.get("output")), specs,
                          options.bench_precision, options.standard)
    if plan.hf32 and not ms_dump:  # Ascend computes fp32 convolutions in HF32 (as the re-run bench assumes) ...
        recorded_on, told = prepare.recorded_device(options, ctx.devices)
        if recorded_on == "npu":
            bench_args = [check._round_input(a, ctx.requires_grad) for a in bench_args]
        else:  # ... a CPU or GPU in full fp32
            record["notes"].append(f"recorded on {recorded_on} ({told}): fp32 inputs not rounded to HF32, "
                                   "which only Ascend's convolutions read")

    def bench_dtype(t: torch.Tensor) -> torch.dtype:
        if plan.raise_to is None or t.dtype not in RAISABLE or (plan.hf32 and t.dtype == torch.float32):
            return t.dtype
        return plan.raise_to

    bench_side = make_side(bench_args, bench_kwargs, device="cpu", dtype_for=bench_dtype,
                           requires_grad=ctx.requires_grad, want_grad=want_grad, bench=True)
    # --msprobe-save-error-data/-html: the inputs as recorded (the bench's fixes are applied again on replay)
    capture.stash(args=args, kwargs=kwargs, requires_grad=ctx.requires_grad, cotangents=cotangents, name=name,
                  framework=framework, mode=mode)
    timings = record["timings"]
    timings["inputs_s"] = time.perf_counter() - started
    reference = _reference(options, name, specs, plan, bench_args, bench_kwargs, ctx.requires_grad, want_grad,
                           bench_fn, bench_label, ms_dump)

    seed_random_apis(record["seed"])
    out_b = check._timed(timings, "bench_s", "bench", lambda: run_side(
        bench_fn, bench_side, autocast=None, device_type="cpu", grad=want_grad), None)
    leaves_b = check._selected(output_leaves(out_b), bare, specs)
    grad_index = user.get("grad_index", specs.get("backward", {}).get("grad_index", {}).get(bare))
    pairs_b = pair_cotangents(leaves_b, cotangents, grad_index) if want_grad else []
    if want_grad and not pairs_b:
        raise NotCheckable(f"{full}: no differentiable output pairs with a recorded gradient")

    grads_ms: dict[int, torch.Tensor] = {}
    if ms_call is not None:
        grad_positions = sorted(pos for pos, _ in bench_side.grad_leaves) if want_grad else []
        leaves_d, grads_ms = check._timed(timings, "device_s", "device", lambda: mindspore.run(
            ms_call, args, kwargs, seed=record["seed"], grad_positions=grad_positions,
            cotangents=dict(pairs_b)), None)
        leaves_d = check._selected(leaves_d, bare, specs)
    else:
        started = time.perf_counter()
        leaves_d = check._selected(_recorded(forward.get("output"), dump, max_bytes, "output"), bare, specs)
        timings["recorded_s"] = time.perf_counter() - started
    capture.stash(out_d=leaves_d, out_b=out_b)

    ref_leaves: list[Any] | None = None
    role = reference.role if reference is not None else "torch"
    if reference is not None and reference.side is not None:
        record["reference"] = reference.label
        ref_side = reference.side
        out_r = check._timed(timings, "reference_s", "reference", lambda: run_side(
            reference.fn, ref_side, autocast=reference.autocast, device_type=reference.device.kind,
            grad=want_grad), reference.device)
        ref_leaves = check._selected(output_leaves(out_r), bare, specs)

    started, waited = time.perf_counter(), check.backward_seconds(timings)
    if backward_entry is None:
        if len(leaves_b) != len(leaves_d):
            raise NotCheckable(f"{full}: the bench ({bench_label}) returns {len(leaves_b)} outputs, the device "
                               f"{len(leaves_d)}: the calls do not correspond, nothing is compared")
        if name.api_type == "NPU" and not any(isinstance(d, Unsaved) for d in leaves_d):
            from bench_functions import postprocess
            leaves_d = postprocess(api, leaves_d, args, kwargs, "device")
            leaves_b = postprocess(api, leaves_b, args, kwargs, "bench")
        _compare_pairs(record, f"{full}.forward.output", leaves_b, leaves_d, ref_leaves, role,
                       list(range(len(leaves_b))), bare, specs, options, framework != "pytorch",
                       scalar_operand=check.has_scalar_operand(args, kwargs))
    elif by_position:
        check._timed(timings, "bench_backward_s", "bench backward", lambda: backward(leaves_b, pairs_b, "cpu"), None)
        grads_b = {pos: leaf.grad for pos, leaf in bench_side.grad_leaves if leaf.grad is not None}
        if ms_call is not None:
            grads_d: dict[int, Any] = grads_ms
        else:
            recorded = _recorded(backward_entry.get("output"), dump, max_bytes, "backward.output")
            grads_d = _by_position(full, recorded, args, grads_b)
        positions = [p for p in sorted(grads_b) if p in grads_d]
        if not positions:
            raise NotCheckable(f"{full}: no recorded gradient of a floating-point argument to compare")
        refs = _reference_grads_by_position(reference, ref_leaves, cotangents, grad_index, positions, record)
        _compare_pairs(record, f"{full}.backward.output", [grads_b[p] for p in positions],
                       [grads_d[p] for p in positions], refs, role, positions, bare, specs, options, True,
                       gradients=True)
    else:
        grads_b, roles, node, node_positions = check._timed(
            timings, "bench_backward_s", "bench backward", lambda: _node_grads(leaves_b, pairs_b, bench_side, "cpu"),
            None)
        recorded = _recorded(backward_entry.get("output"), dump, max_bytes, "backward.output")
        slots = _match_slots(full, recorded, grads_b, node, record["notes"])
        record["notes"] += [f"backward.output.{j}: {roles[j]} (input {j} of {node})" for j in slots]
        refs = estimated = None
        if ref_leaves is not None and reference is not None and reference.side is not None:
            try:
                pairs_r = pair_cotangents(ref_leaves, [reference.cotangent(c) for c in cotangents], grad_index)
                if reference.sampled is not None:  # a sampled torch run: its own autograd node, rows to complete
                    refs, estimated = _sampled_grads(reference, ref_leaves, pairs_r, grads_b, node_positions, slots)
                else:
                    grads_r = _node_grads(ref_leaves, pairs_r, reference.side, reference.device.name)[0]
                    if [tuple(grads_r[j].shape) for j in slots] != [tuple(grads_b[j].shape) for j in slots]:
                        raise NotCheckable("a different autograd layout")
                    refs = [grads_r[j] for j in slots]
            except (NotCheckable, IndexError, AttributeError) as exc:
                record["notes"].append(f"reference gradients not used: {exc}")
        _compare_pairs(record, f"{full}.backward.output", [grads_b[j] for j in slots],
                       [recorded[j] for j in slots], refs, role, slots, bare, specs, options, False,
                       gradients=True, estimated=estimated)
    timings["compare_s"] = time.perf_counter() - started - (check.backward_seconds(timings) - waited)
    check.finish_record(record)


# ----------------------------------------------------------------------------- recorded values


def _is_tensor(leaf: Any) -> bool:
    return isinstance(leaf, dict) and leaf.get("type") in TENSOR_TYPES


def _require_saved(full: str, encoded: Any, where: str) -> None:
    """Replay needs the real inputs: a non-empty tensor the dump did not save cannot be invented."""
    def walk(value: Any, at: str) -> None:
        if isinstance(value, list):
            for i, v in enumerate(value):
                walk(v, f"{at}.{i}")
        elif _is_tensor(value):
            shape = value.get("shape")
            empty = isinstance(shape, list) and 0 in shape
            if not (value.get("data_name") or value.get("datapath")) and not empty:
                raise NotCheckable(f"{full} {at}: the dump saved no tensor for it; replay needs every input "
                                   "from dump_tensor_data/")
        elif isinstance(value, dict) and "type" not in value:
            for k, v in value.items():
                walk(v, f"{at}.{k}")

    walk(encoded, where)


def _recorded(encoded: Any, dump: Dump, max_bytes: int, where: str) -> list[Any]:
    """The recorded values, flattened like execution.output_leaves (None kept): saved tensors, scalars."""
    out: list[Any] = []
    _recorded_into(encoded, BuildContext(dump, torch.Generator(), True, max_bytes), where, out)
    return out


def _recorded_into(value: Any, ctx: BuildContext, at: str, out: list[Any]) -> None:
    # module-level recursion: a nested recursive function would keep `out`'s tensors in a reference cycle
    if isinstance(value, list):
        for i, v in enumerate(value):
            _recorded_into(v, ctx, f"{at}.{i}", out)
    elif value is None:
        out.append(None)
    elif _is_tensor(value):
        out.append(_saved_tensor(value, ctx, at))
    elif isinstance(value, dict) and value and "type" not in value and "class_type" not in value:
        for k, v in value.items():  # namedtuple / structseq outputs
            _recorded_into(v, ctx, f"{at}.{k}", out)
    else:
        out.append(build(value, ctx, at))


def _saved_tensor(leaf: dict[str, Any], ctx: BuildContext, where: str) -> Any:
    dtype, shape = parse_dtype(leaf.get("dtype")), _shape(leaf, where)
    loaded = _load_saved(leaf, ctx, where, dtype, shape)
    if loaded is not None:
        return loaded
    if math.prod(shape) == 0:
        return torch.empty(shape, dtype=dtype)
    return Unsaved(where, tuple(shape))


def _output_dtype(encoded: Any) -> torch.dtype | None:
    """The AMP hint of plan_precision: the first recorded float output's dtype (MindSpore names too)."""
    from ..dump.reader import iter_leaves

    for leaf in iter_leaves(encoded):
        if isinstance(leaf, dict) and isinstance(leaf.get("dtype"), str):
            try:
                dtype = parse_dtype(leaf["dtype"])
            except InputError:
                return None
            return dtype if dtype.is_floating_point else None
    return None


# ----------------------------------------------------------------------------- gradients


def _node_grads(outputs: list[Any], pairs: list[tuple[int, Any]], side: Any,
                device: str) -> tuple[list[Any], list[str], str, list[int | None]]:
    """Backpropagate and return what flows out of the outputs' autograd node, slot by slot, as msprobe
    records it for PyTorch (with each slot's role), the node's name, and per slot the position of the
    tensor argument whose gradient it is as such (None: transposed, an intermediate, a leaf of no argument)."""
    nodes = {id(outputs[i].grad_fn): outputs[i].grad_fn for i, _ in pairs if outputs[i].grad_fn is not None}
    if len(nodes) != 1:
        raise NotCheckable(f"the differentiated outputs come from {len(nodes)} autograd nodes; msprobe's recorded "
                           "gradients cannot be matched to them")
    node = next(iter(nodes.values()))
    clones = {id(t.grad_fn) for t in tensors_of(side.args) + tensors_of(side.kwargs) if t.grad_fn is not None}
    if id(node) in clones:
        raise NotCheckable("the API returned an input unchanged (no autograd node of its own): msprobe recorded "
                           "the gradients of whatever produced that input")
    captured: list[tuple[Any, ...]] = []
    handle = node.register_hook(lambda grad_inputs, grad_outputs: captured.append(grad_inputs))
    try:
        backward(outputs, pairs, device)
    finally:
        handle.remove()
    if not captured:
        raise NotCheckable(f"{node.name()} produced no gradients")
    leaves = {id(leaf): pos for pos, leaf in side.grad_leaves}
    roles = [_role(fn, leaves, clones) for fn, _ in node.next_functions]
    return list(captured[0]), [r for r, _ in roles], node.name(), [p for _, p in roles]


def _role(fn: Any, leaves: dict[int, int], clones: set[int]) -> tuple[str, int | None]:
    transposed = False
    while fn is not None:
        kind = fn.name().rsplit("::", 1)[-1]  # torch::autograd::AccumulateGrad
        if kind == "AccumulateGrad":
            pos = leaves.get(id(fn.variable))
            if pos is None:
                return "a leaf tensor", None
            return f"the gradient of tensor argument {pos}{', transposed' if transposed else ''}", \
                None if transposed else pos
        if id(fn) in clones:
            fn = fn.next_functions[0][0]
        elif kind in _TRANSPOSES and not transposed:
            transposed, fn = True, fn.next_functions[0][0]
        else:
            return f"the gradient of an intermediate result ({kind})", None
    return "no gradient", None


def _sampled_grads(reference: Any, ref_leaves: list[Any], pairs_r: list[Any], grads_b: list[Any],
                   positions: list[int | None], slots: list[int]) -> tuple[list[Any], list[Any]]:
    """A sampled torch run's gradients of the slots' tensor arguments, its unsampled rows completed from
    the bench's (ReferenceRun.complete, as a re-run item does), and the masks of the estimated elements."""
    wanted = [positions[j] for j in slots]
    if any(p is None for p in wanted):
        raise NotCheckable("a recorded gradient is not an argument's own")
    backward(ref_leaves, pairs_r, reference.device.name)
    by_pos = {pos: leaf.grad for pos, leaf in reference.side.grad_leaves}
    if any(by_pos.get(p) is None for p in wanted):
        raise NotCheckable("the sampled run has no gradient for every argument")
    grads, estimated = reference.complete([by_pos[p] for p in wanted], [grads_b[j] for j in slots], wanted)
    return list(grads), list(estimated)


def _match_slots(full: str, recorded: list[Any], grads: list[Any], node: str, notes: list[str]) -> list[int]:
    """Slots where a recorded gradient and the bench's gradient of the same node input meet, shapes equal."""
    if any(r is not None for r in recorded[len(grads):]) or any(g is not None for g in grads[len(recorded):]):
        raise NotCheckable(f"{full}: the dump recorded {len(recorded)} gradients, {node} has {len(grads)} inputs "
                           "here: which gradient is which cannot be told, nothing is compared")
    slots = []
    for j, (r, g) in enumerate(zip(recorded, grads)):
        if r is None or g is None:
            if (r is None) != (g is None):
                notes.append(f"backward.output.{j}: {'recorded as null' if r is None else 'no bench gradient'}, "
                             "not compared")
            continue
        shape = r.shape if isinstance(r, Unsaved) else tuple(r.shape) if isinstance(r, torch.Tensor) else None
        if shape is None or tuple(shape) != tuple(g.shape):
            recorded_shape = None if shape is None else list(shape)
            raise NotCheckable(f"{full}: recorded backward.output.{j} has shape {recorded_shape}, input {j} of "
                               f"{node} has {list(g.shape)} here: the layouts differ, nothing is compared")
        slots.append(j)
    if not slots:
        raise NotCheckable(f"{full}: no recorded gradient meets a bench gradient")
    return slots


def _by_position(full: str, recorded: list[Any], args: list[Any], grads_b: dict[int, Any]) -> dict[int, Any]:
    """MindSpore: one recorded gradient per positional tensor argument (or per float one), by position."""
    positional = tensors_of(args)
    floats = [p for p, t in enumerate(positional) if t.is_floating_point()]
    if len(recorded) == len(positional):
        order = list(range(len(positional)))
    elif len(recorded) == len(floats):
        order = floats
    else:
        raise NotCheckable(f"{full}: the dump recorded {len(recorded)} gradients for {len(positional)} tensor "
                           f"arguments ({len(floats)} floating-point): which is which cannot be told")
    out = {}
    for j, pos in enumerate(order):
        r = recorded[j]
        if r is None or pos not in grads_b:
            continue
        shape = r.shape if isinstance(r, Unsaved) else tuple(r.shape) if isinstance(r, torch.Tensor) else None
        if shape is None or tuple(shape) != tuple(positional[pos].shape):
            raise NotCheckable(f"{full}: recorded backward.output.{j} has shape "
                               f"{None if shape is None else list(shape)}, tensor argument {pos} has "
                               f"{list(positional[pos].shape)}: the layouts differ, nothing is compared")
        out[pos] = r
    return out


def _reference(options: CheckOptions, name: EntryName, specs: dict[str, Any], plan: Any, args: list[Any],
               kwargs: dict[str, Any], requires_grad: set[int], want_grad: bool, bench_fn: Any, label: str,
               ms_dump: bool) -> Any:
    """The third run of the standards that use one (check._reference_side), with the torch bench callable."""
    if options.reference_device and ms_dump:
        ref_device = select_device(options.reference_device)
        side = make_side(args, kwargs, device=ref_device.name, dtype_for=lambda t: t.dtype,
                         requires_grad=requires_grad, want_grad=want_grad, bench=False)
        return ReferenceRun(side, bench_fn, plan.autocast, ref_device, f"{label} on {ref_device.name}")
    return third_run(options, SimpleNamespace(bench_fn=bench_fn), name, specs, plan, args, kwargs, requires_grad,
                     want_grad)


def _reference_grads_by_position(reference: Any, ref_leaves: list[Any] | None, cotangents: list[Any],
                                 grad_index: int | None, positions: list[int],
                                 record: dict[str, Any]) -> list[Any] | None:
    if ref_leaves is None or reference is None or reference.side is None:
        return None
    pairs_r = pair_cotangents(ref_leaves, [reference.cotangent(c) for c in cotangents], grad_index)
    backward(ref_leaves, pairs_r, reference.device.name)
    by_pos = {pos: leaf.grad for pos, leaf in reference.side.grad_leaves}
    if any(by_pos.get(p) is None for p in positions):
        record["notes"].append("reference gradients not used: the reference run has no gradient for every input")
        return None
    return [by_pos[p] for p in positions]


# ----------------------------------------------------------------------------- comparing


def _compare_pairs(record: dict[str, Any], prefix: str, bench: list[Any], device: list[Any],
                   third: list[Any] | None, role: str, positions: list[int], api: str, specs: dict[str, Any],
                   options: CheckOptions, ms_format: bool, *, scalar_operand: bool = False,
                   gradients: bool = False, estimated: list[Any] | None = None) -> None:
    """compare.compare_outputs on the pairs with a saved device value; SKIP rows for unsaved ones; the MindSpore
    checker's metrics on each row of a MindSpore dump (its CSV columns)."""
    keep = [i for i, d in enumerate(device) if not isinstance(d, Unsaved)]
    start = len(record["outputs"])
    if keep:
        compare.compare_outputs(record, prefix, [bench[i] for i in keep], [device[i] for i in keep],
                       None if third is None else [third[i] for i in keep], role, api, specs, options,
                       [positions[i] for i in keep], scalar_operand=scalar_operand, gradients=gradients,
                       estimated=None if estimated is None else [estimated[i] for i in keep],
                       contract=record.get("contract", "torch"))
    rows = record["outputs"][start:]
    if ms_format and len(rows) == len(keep):
        epsilon = specs["thresholds"]["mindspore"]["epsilon"]
        for row, i in zip(rows, keep):
            b, d = compare.to_numpy(bench[i]), compare.to_numpy(device[i])
            if b[0] == "tensor" and d[0] == "tensor":
                row["ms_metrics"] = ms_results.ms_metrics(b[1], d[1], epsilon)
    for i, d in enumerate(device):
        if isinstance(d, Unsaved):
            row = OutputComparison(f"{prefix}.{positions[i]}", "SKIP", f"{d.where}: not saved in dump_tensor_data/, "
                                   "nothing to compare", " ", " ", list(d.shape), blank_metrics(), verdict="SKIP")
            record["outputs"].append(row.to_dict())
