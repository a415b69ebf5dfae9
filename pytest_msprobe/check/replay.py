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

Two device sources (source.DeviceSource) take the protocol's stages (protocol.py), each one call: entries (as a
re-run item's, then the admitted modes); placement (the bench, the torch twin of a MindSpore call; where the
device result comes from, recorded.py: the saved outputs, or MindSpore running the call); the inputs; the
precision plan and the recording kernel's input rounding (precision.py, as a re-run's); the runs (`ExternalRuns`:
the bench's run, the device's result, and the third and magnitude runs of execute.py); the comparison, whose
gradients gradients.py matches to the recorded ones.
"""
from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field
from typing import Any

from ..dump.reader import Dump
from ..records.record import Record
from ..runs import capture, mindspore
from ..runs.backends import BUILTIN_BACKENDS
from ..runs.backends import select as select_device
from ..runs.execution import (
    Device,
    NotCheckable,
    Resolved,
    Side,
    Target,
    backward,
    make_side,
    pair_cotangents,
    resolve,
    seed_random_apis,
    tensors_of,
)
from ..runs.third_run import ReferenceRun, Summed, summed_outputs
from ..settings import CheckOptions
from ..specs.loader import api_settings, in_list
from ..verdict import ms_results
from . import calls, execute, gradients, precision, prepare, unique
from .kinds import Comparison, compare_outputs
from .placement import Placement
from .precision import Inputs
from .recorded import MindSporeRun, Recorded, Unsaved, recorded, require_saved
from .source import DeviceSource, Item, RunsStrategy


def effective_mode(dump: Dump, options: CheckOptions) -> str:
    """`replay` or `rerun` for this dump. auto: replay MindSpore tensor dumps (as msprobe's checker
    does: the device result is what the dump saved), re-run everything else."""
    if options.mode != "auto":
        return options.mode
    if dump.framework != "pytorch" and dump.is_real_data and options.data_mode != "random":
        return "replay"
    return "rerun"


@dataclass
class Case(Item):
    """A replayed or MindSpore item as its stages fill it in. Beside the base's fields (`where`: the bench, on the
    CPU; `inputs`: as the bench reads them, msprobe's conversions and the recording kernel's rounding applied): the
    device result's source, the inputs as recorded (what the device's call was given), and the bench's side."""

    mode: str = ""
    source: Recorded | MindSporeRun = field(default_factory=Recorded)
    recorded: Inputs = field(init=False)
    saved_on: set[str] = field(default_factory=set)
    max_bytes: int = 0
    by_position: bool = False
    bench_side: Side | None = None
    summed: Summed | None = None  # the magnitude run of sums, or a composite's terms run (execute.bounding_run)
    summed_leaves: list[Any] | None = None

    @property
    def ms_dump(self) -> bool:
        return self.dump.framework == "mindspore"


class External(DeviceSource):
    """The device sources whose result is not a local torch run; each stage one call of this module. Nothing is
    shared between the sides, so no item is checked again."""

    retries = False

    @classmethod
    def applies(cls, dump: Dump, options: CheckOptions) -> bool:
        return options.mode == "replay" or dump.framework != "pytorch"

    def item(self, dump: Dump, name: Any, options: CheckOptions, specs: dict[str, Any], record: Record,
             shared: Any) -> Case:
        return Case(dump, name, options, specs, record, shared, mode=effective_mode(dump, options))

    def entries(self, item: Any) -> None:
        from .rerun import entries

        entries(item)  # as a re-run item's, first
        admitted(item)
        item.forward = prepare.entry_of(item.dump, item.name.full_name, "forward")
        item.backward_entry = prepare.entry_of(item.dump, item.name.full_name, "backward") \
            if item.name.direction == "backward" else None

    def placement(self, item: Any) -> None:
        item.where = choose_bench(item)
        item.source = device_source(item)
        item.source.describe(item.record, item.where.resolved.label)

    def inputs(self, item: Any) -> None:
        item.started = time.perf_counter()
        item.recorded, item.inputs = replay_inputs(item)
        item.where = item.where._replace(contract=item.record.contract, resolved=recorded_ties(item))

    def precision(self, item: Any) -> None:
        item.plan = precision.plan(item.api, item.inputs, item.forward, item.specs, item.options)
        item.inputs = kernel_rounding(item)
        inputs, recorded = item.inputs, item.recorded
        item.bench_side = make_side(inputs.args, inputs.kwargs,
                                    target=Target("cpu", precision.bench_dtype(item.plan), True),
                                    requires_grad=inputs.requires_grad, want_grad=item.want_grad)
        # --msprobe-save-error-data/-html: the inputs as recorded (the bench's fixes are applied again on replay)
        capture.stash(args=recorded.args, kwargs=recorded.kwargs, requires_grad=recorded.requires_grad,
                      cotangents=recorded.cotangents, name=item.name, framework=item.dump.framework, mode=item.mode)
        item.record.timings["inputs_s"] = time.perf_counter() - item.started

    def runs(self, item: Any) -> RunsStrategy:
        return ExternalRuns(item)


class RecordedOutputs(External):
    """The device's result: the outputs the dump saved (replay mode; MindSpore tensor dumps by default)."""

    @classmethod
    def applies(cls, dump: Dump, options: CheckOptions) -> bool:
        return super().applies(dump, options) and effective_mode(dump, options) == "replay"


class MindSporeRerun(External):
    """The device's result: MindSpore running the recorded call again (runs/mindspore.py)."""

    @classmethod
    def applies(cls, dump: Dump, options: CheckOptions) -> bool:
        return super().applies(dump, options) and effective_mode(dump, options) == "rerun"


class ExternalRuns(RunsStrategy):
    """The bench's run, the device's result from its source, the third run and the magnitude run; compared by
    `compare_case`."""

    def __init__(self, item: Case) -> None:
        self.case = item

    def run(self) -> tuple[Any, list[Any], list[Any], list[Any] | None, list[Any]]:
        case = self.case
        reference, case.summed = beside_runs(case)
        out_b, leaves_b, pairs_b = bench_run(case)
        leaves_d = case.source.outputs(case, pairs_b)
        capture.stash(out_d=leaves_d, out_b=out_b)
        ref_leaves = reference_run(case, reference)
        case.summed_leaves = forward_run(case, case.summed.run if case.summed is not None else None, "magnitude")
        return reference, leaves_b, leaves_d, ref_leaves, pairs_b

    def compare(self, outputs: tuple[Any, list[Any], list[Any], list[Any] | None, list[Any]]) -> None:
        timings = self.case.record.timings
        started, waited = time.perf_counter(), calls.backward_seconds(timings)
        compare_case(self.case, *outputs)
        timings["compare_s"] = time.perf_counter() - started - (calls.backward_seconds(timings) - waited)


def admitted(case: Case) -> Case:
    """The modes and frameworks this flow checks; NotCheckable for the others."""
    dump, mode, full, record = case.dump, case.mode, case.name.full_name, case.record
    framework = dump.framework
    record.mode = mode
    if framework != "pytorch":
        record.framework = framework
    reason = case.specs.get("unsupported_types", {}).get(case.name.api_type)
    if reason:
        raise NotCheckable(f"{full}: {reason}")
    if mode == "replay" and not dump.is_real_data:
        raise NotCheckable(f"--msprobe-mode replay compares the outputs a tensor dump saved; this is a "
                           f"{dump.task or 'statistics'} dump without dump_tensor_data/")
    if mode == "rerun" and framework not in ms_results.MS_FRAMEWORKS:
        raise NotCheckable(f"{framework} dumps are checked in replay mode only (re-running needs {framework})")
    return case


def choose_bench(case: Case) -> Placement:
    """The bench: PyTorch on CPU (through the MindSpore -> torch table for MindSpore dumps); the user's skip. The
    contract is the recording device's, once the inputs stage has read where the saved tensors were."""
    name, specs, api, full = case.name, case.specs, case.name.api_name, case.name.full_name
    if case.ms_dump:
        twin = mindspore.torch_twin(name.api_type, api, specs)
        resolved, case.bare = Resolved(twin.fn, twin.fn, twin.label), twin.api
        for group in ("always_skip", "random_apis"):
            if case.bare != api and in_list(specs, case.bare, group):
                raise NotCheckable(f"{full} ({twin.label}): {specs[group]['reason']}")
    else:
        # torch's own autograd node: the recorded gradients are its slots; a replayed item is never cut in pieces
        resolved, case.bare = resolve(name.api_type, api, Device("cpu"), specs, case.forward,
                                      tiled_gradients=False), api
    case.user = {**api_settings(specs, api), **api_settings(specs, case.bare)}
    if case.user.get("skip"):
        raise NotCheckable(f"{full}: {case.user['skip']} (msprobe_specs)")
    return Placement(Device("cpu"), resolved, "torch")


def device_source(case: Case) -> Recorded | MindSporeRun:
    """Where the device result comes from: MindSpore re-running the call, else the dump's saved outputs."""
    if case.mode == "rerun":
        options = case.options
        return MindSporeRun(mindspore.ms_callable(case.name.api_type, case.name.api_name, case.specs, options.device,
                                                  options.device_index, case.dump.framework))
    return Recorded()


def replay_inputs(case: Case) -> tuple[Inputs, Inputs]:
    """The inputs, saved (replay needs every one) or drawn: as recorded, and as the bench reads them (msprobe's
    dtype conversions for CPU kernels)."""
    dump, options, full, record = case.dump, case.options, case.name.full_name, case.record
    forward = case.forward
    args_enc, kwargs_enc = forward.get("input_args") or [], forward.get("input_kwargs") or {}
    real = case.mode == "replay" or options.data_mode == "real" or (options.data_mode == "auto" and dump.is_real_data)
    if case.mode == "replay":
        require_saved(full, args_enc, "input_args")
        require_saved(full, kwargs_enc, "input_kwargs")
        if case.backward_entry is not None:
            require_saved(full, case.backward_entry.get("input"), "backward.input")
    ctx, args, kwargs, cotangents = prepare.build_inputs(prepare.Build(
        dump, case.bare, args_enc, kwargs_enc, case.backward_entry, record.seed, real, options, case.specs))
    case.by_position = case.ms_dump or case.source.runs_here  # MindSpore's: one per positional tensor argument
    if case.by_position and (case.ms_dump or not ctx.requires_grad):  # none recorded: every float tensor (§7.4)
        ctx.requires_grad.update(id(t) for t in tensors_of(args) if t.is_floating_point())
    bench_args, bench_kwargs = prepare.preprocess(case.bare, args, kwargs, case.specs, ctx.requires_grad)
    case.max_bytes = ctx.max_bytes
    record.notes += ctx.notes
    record.data = "real" if ctx.loaded_files else "random"
    record.contract = prepare.replay_contract(options, case.mode, ctx.devices)
    case.saved_on = ctx.devices
    return (Inputs(args, kwargs, cotangents, ctx.requires_grad),
            Inputs(bench_args, bench_kwargs, cotangents, ctx.requires_grad))


def recorded_ties(case: Case) -> Resolved:
    """The bench of a replayed backward item of a sort-like API follows the indices its forward recorded, where
    they break ties another valid way (unique.following); every other item's bench as chosen."""
    resolved = case.where.resolved
    if not case.want_grad or case.mode != "replay" or \
            not in_list(case.specs, case.bare, "error_model", "not_unique", "ties"):
        return resolved
    leaves = recorded(case.forward.get("output"), case.dump, case.max_bytes, "output")
    if len(leaves) < 2 or not unique.is_indices(leaves[1]):
        return resolved
    case.record.notes.append("the bench follows the recorded indices where they choose among tied values")
    return dataclasses.replace(resolved, bench_fn=unique.following(case.bare, resolved.bench_fn, leaves[1]))


def kernel_rounding(case: Case) -> Inputs:
    """The bench's inputs as the recording device's kernel read them (precision.round_inputs): Ascend's HF32
    convolutions, as a re-run's bench assumes; CUDA's TF32 ones, by torch's settings in this process (a dump does
    not record the job's); MindSpore's calls', as recorded."""
    plan, options, record = case.plan, case.options, case.record
    if case.ms_dump:
        return case.inputs
    recorded_on, told = prepare.recorded_device(options, case.saved_on)
    hf32 = plan.hf32 and recorded_on == "npu"
    if plan.hf32 and not hf32:
        record.notes.append(f"recorded on {recorded_on} ({told}): fp32 inputs not rounded to HF32, "
                            "which only Ascend's convolutions read")
    backend = BUILTIN_BACKENDS.get(recorded_on)
    return precision.round_inputs(case.api, case.inputs, hf32, Device(recorded_on, None, backend and backend()),
                                  case.specs, record.notes)


def bench_run(case: Case) -> tuple[Any, list[Any], list[Any]]:
    """The bench's forward; its outputs, the compared ones, and (backward) the recorded gradients they pair with."""
    bench_side = case.bench_side
    assert bench_side is not None
    resolved = case.where.resolved
    seed_random_apis(case.record.seed)
    out_b, leaves_b = execute.forward_outputs(case, ReferenceRun(bench_side, resolved.bench_fn, None, Device("cpu"),
                                                                 resolved.label), "bench")
    pairs_b = pair_cotangents(leaves_b, case.inputs.cotangents, case.grad_index) if case.want_grad else []
    if case.want_grad and not pairs_b:
        raise NotCheckable(f"{case.name.full_name}: no differentiable output pairs with a recorded gradient")
    return out_b, leaves_b, pairs_b


def reference_run(case: Case, reference: ReferenceRun | None) -> list[Any] | None:
    """The third run's forward outputs (None without one); the record names it."""
    if reference is not None and reference.side is not None:
        case.record.reference = reference.label
    return forward_run(case, reference, "reference")


def forward_run(case: Case, run: ReferenceRun | None, key: str) -> list[Any] | None:
    """A run beside the bench (the third run, the magnitude run): its forward outputs, timed under `key`; None
    without one."""
    return None if run is None or run.side is None else execute.forward_outputs(case, run, key)[1]


def summed_by_slot(case: Case, slots: list[int], grads_b: list[Any]) -> tuple[list[Any], str] | None:
    """Per compared slot, the summed run's gradient where that slot's argument's gradient is a sum (None
    elsewhere, and where the summed run's node lays its slots out otherwise), with the thresholds' section."""
    summed, pairs = _summed_pairs(case)
    if summed is None or summed.run.side is None or case.summed_leaves is None:
        return None
    try:
        grads, _, _, positions = gradients.node_grads(case.summed_leaves, pairs, summed.run.side, "cpu")
    except (NotCheckable, RuntimeError) as exc:
        case.record.notes.append(f"magnitude gradients not used: {exc}")
        return None
    return [summed.sized(grads[j]) if j < len(grads) and positions[j] in summed.positions and grads[j] is not None
            and tuple(grads[j].shape) == tuple(grads_b[j].shape) else None for j in slots], summed.rules


def summed_by_position(case: Case, positions: list[int]) -> tuple[list[Any], str] | None:
    """MindSpore's gradients by argument position: the summed run's gradient of each summed argument."""
    summed, pairs = _summed_pairs(case)
    if summed is None or summed.run.side is None or case.summed_leaves is None:
        return None
    try:
        backward(case.summed_leaves, pairs, "cpu")
    except RuntimeError as exc:
        case.record.notes.append(f"magnitude gradients not used: {exc}")
        return None
    by_pos = {p: summed.sized(leaf.grad) for p, leaf in summed.run.side.grad_leaves if p in summed.positions}
    return [by_pos.get(p) for p in positions], summed.rules


def _summed_pairs(case: Case) -> tuple[Summed | None, list[Any]]:
    """The summed run and its outputs paired with the recorded gradients as it backpropagates them (|g|)."""
    summed, leaves = case.summed, case.summed_leaves
    if summed is None or leaves is None:
        return None, []
    return summed, pair_cotangents(leaves, [summed.run.cotangent(c) for c in case.inputs.cotangents],
                                   case.grad_index)


def compare_case(case: Case, reference: ReferenceRun | None, leaves_b: list[Any], leaves_d: list[Any],
                 ref_leaves: list[Any] | None, pairs_b: list[Any]) -> None:
    """How the outputs are compared: a forward item's outputs, or its gradients by position or by autograd slot."""
    name, full, record = case.name, case.name.full_name, case.record
    role = reference.role if reference is not None else "torch"
    if case.backward_entry is None:
        if len(leaves_b) != len(leaves_d):
            raise NotCheckable(f"{full}: the bench ({case.where.resolved.label}) returns {len(leaves_b)} outputs, the device "
                               f"{len(leaves_d)}: the calls do not correspond, nothing is compared")
        if name.api_type == "NPU" and not any(isinstance(d, Unsaved) for d in leaves_d):
            from bench_functions import postprocess
            args, kwargs = case.recorded.args, case.recorded.kwargs
            leaves_d = postprocess(name.api_name, leaves_d, args, kwargs, "device")
            leaves_b = postprocess(name.api_name, leaves_b, args, kwargs, "bench")
        # ties, writers, factors: as a re-run judges them
        _compare_pairs(case, Comparison(
            record, f"{full}.forward.output", leaves_b, leaves_d, ref_leaves, role, case.bare, case.specs, case.options,
            list(range(len(leaves_b))), scalar_operand=calls.has_scalar_operand(case.recorded.args,
                                                                                 case.recorded.kwargs),
            summed=summed_outputs(case.summed, case.summed_leaves, False), ms_format=case.dump.framework != "pytorch",
            validity=(name.api_name, case.recorded.args, case.recorded.kwargs)))
    elif case.by_position:
        compare_by_position(case, reference, leaves_b, ref_leaves, pairs_b, role)
    else:
        compare_by_slot(case, reference, leaves_b, ref_leaves, pairs_b, role)


def compare_by_position(case: Case, reference: ReferenceRun | None, leaves_b: list[Any],
                        ref_leaves: list[Any] | None, pairs_b: list[Any], role: str) -> None:
    """MindSpore's gradients: one per positional tensor argument, compared with the bench's of that argument."""
    full, record, bench_side = case.name.full_name, case.record, case.bench_side
    assert bench_side is not None
    calls.timed(record.timings, "bench_backward_s", "bench backward", lambda: backward(leaves_b, pairs_b, "cpu"),
                None)
    grads_b = {pos: leaf.grad for pos, leaf in bench_side.grad_leaves if leaf.grad is not None}
    if isinstance(case.source, MindSporeRun):
        grads_d: dict[int, Any] = case.source.grads
    else:
        grads_d = gradients.by_position(full, case.source.gradients(case), case.recorded.args, grads_b)
    positions = [p for p in sorted(grads_b) if p in grads_d]
    if not positions:
        raise NotCheckable(f"{full}: no recorded gradient of a floating-point argument to compare")
    refs = gradients.reference_grads_by_position(reference, ref_leaves, case.inputs.cotangents, case.grad_index,
                                                 positions, record)
    _compare_pairs(case, Comparison(
        record, f"{full}.backward.output", [grads_b[p] for p in positions], [grads_d[p] for p in positions], refs,
        role, case.bare, case.specs, case.options, positions, gradients=True,
        summed=summed_by_position(case, positions), ms_format=True))


def compare_by_slot(case: Case, reference: ReferenceRun | None, leaves_b: list[Any],
                    ref_leaves: list[Any] | None, pairs_b: list[Any], role: str) -> None:
    """PyTorch's recorded gradients: slot by slot of the output's autograd node, the bench's node hooked alike."""
    full, record, bench_side = case.name.full_name, case.record, case.bench_side
    grads_b, roles, node, node_positions = calls.timed(
        record.timings, "bench_backward_s", "bench backward",
        lambda: gradients.node_grads(leaves_b, pairs_b, bench_side, "cpu"), None)
    source = case.source
    assert isinstance(source, Recorded)  # MindSpore's gradients are matched by position
    recorded_grads = source.gradients(case)
    slots = gradients.match_slots(full, recorded_grads, grads_b, node, record.notes)
    record.notes += [f"backward.output.{j}: {roles[j]} (input {j} of {node})" for j in slots]
    refs = estimated = None
    if ref_leaves is not None and reference is not None and reference.side is not None:
        try:
            pairs_r = pair_cotangents(ref_leaves, [reference.cotangent(c) for c in case.inputs.cotangents],
                                      case.grad_index)
            if reference.sampled is not None:  # a sampled torch run: its own autograd node, rows to complete
                refs, estimated = gradients.sampled_grads(reference, ref_leaves, pairs_r, grads_b, node_positions,
                                                          slots)
            else:
                grads_r = gradients.node_grads(ref_leaves, pairs_r, reference.side, reference.device.name)[0]
                if [tuple(grads_r[j].shape) for j in slots] != [tuple(grads_b[j].shape) for j in slots]:
                    raise NotCheckable("a different autograd layout")
                refs = [grads_r[j] for j in slots]
        except (NotCheckable, IndexError, AttributeError) as exc:
            record.notes.append(f"reference gradients not used: {exc}")
    _compare_pairs(case, Comparison(
        record, f"{full}.backward.output", [grads_b[j] for j in slots], [recorded_grads[j] for j in slots], refs,
        role, case.bare, case.specs, case.options, slots, gradients=True, estimated=estimated,
        summed=summed_by_slot(case, slots, grads_b)))


def beside_runs(case: Case) -> tuple[ReferenceRun | None, Summed | None]:
    """The third run and the magnitude run, as a re-run item's (execute.third_runs); a MindSpore call's third run
    on a reference device is its torch twin there."""
    options, plan, label, inputs = case.options, case.plan, case.where.resolved.label, case.inputs
    if not (options.reference_device and case.ms_dump):
        return execute.third_runs(case)
    ref_device = select_device(options.reference_device)
    side = make_side(inputs.args, inputs.kwargs, target=Target(ref_device.name, lambda t: t.dtype, False),
                     requires_grad=inputs.requires_grad, want_grad=case.want_grad)
    return (ReferenceRun(side, case.where.resolved.bench_fn, plan.autocast, ref_device, f"{label} on {ref_device.name}"),
            execute.bounding_run(case))


# ----------------------------------------------------------------------------- comparing



def _compare_pairs(case: Case, job: Comparison) -> None:
    """The pairs compared, each kind of output by itself (kinds.py), in the contract the record names."""
    job.contract = case.record.contract or "torch"
    compare_outputs(job)
