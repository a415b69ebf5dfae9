"""Matching a replayed backward item's gradients to the recorded ones, and the third run's to both.

* PyTorch dumps: msprobe records what flows out of the API output's autograd node, slot by slot (`node_grads`,
  `match_slots`); a sampled torch run's gradients are completed from the bench's (`sampled_grads`).
* MindSpore dumps: one gradient per positional tensor argument, matched by position (`by_position`).

Apart from replay.py (the stages) because it reads autograd's graph, which no other stage does.
"""
from __future__ import annotations

from typing import Any

import torch

from ..records.record import Record
from ..runs.execution import NotCheckable, backward, pair_cotangents, tensors_of
from .recorded import Unsaved

_TRANSPOSES = ("TBackward0", "TransposeBackward0", "TransposeBackward1", "PermuteBackward0")



def node_grads(outputs: list[Any], pairs: list[tuple[int, Any]], side: Any,
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


def sampled_grads(reference: Any, ref_leaves: list[Any], pairs_r: list[Any], grads_b: list[Any],
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


def match_slots(full: str, recorded: list[Any], grads: list[Any], node: str, notes: list[str]) -> list[int]:
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


def by_position(full: str, recorded: list[Any], args: list[Any], grads_b: dict[int, Any]) -> dict[int, Any]:
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


def reference_grads_by_position(reference: Any, ref_leaves: list[Any] | None, cotangents: list[Any],
                                 grad_index: int | None, positions: list[int],
                                 record: Record) -> list[Any] | None:
    if ref_leaves is None or reference is None or reference.side is None:
        return None
    pairs_r = pair_cotangents(ref_leaves, [reference.cotangent(c) for c in cotangents], grad_index)
    backward(ref_leaves, pairs_r, reference.device.name)
    by_pos = {pos: leaf.grad for pos, leaf in reference.side.grad_leaves}
    if any(by_pos.get(p) is None for p in positions):
        record.notes.append("reference gradients not used: the reference run has no gradient for every input")
        return None
    return [by_pos[p] for p in positions]
