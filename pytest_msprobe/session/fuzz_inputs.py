"""The drawn inputs of `--msprobe-fuzz` (session/fuzz.py runs them): what may be drawn for each recorded
tensor, the hypothesis strategy, the tensor a recipe makes, its description, and the shrink past hypothesis.

A drawn tensor is a recipe that shrinks well: a base (`center`: every element the in-range value
nearest 0; `uniform`: uniform in [Min, Max]; `edges`: every element one of the edge values), up to 8
special elements (an edge value or any value in range, at an index), and the memory layout
(contiguous, or the last two dimensions transposed in memory). Shapes, dtypes and every non-tensor
argument stay as recorded; integers stay in [Min, Max] (index ranges), bools follow the recorded
Min/Max (masks), class targets stay >= 0 as msprobe's preprocessing wants. Edge values of a float
tensor: the exact recorded Min and Max, one ULP inside each, ±0, the smallest normal and subnormal
numbers of the dtype, the largest finite values, all only when they lie in the recorded range; inf and
NaN only when the statistics recorded them.
"""
from __future__ import annotations

import dataclasses
import math
import sys
from collections.abc import Iterator
from typing import Any, Union

TENSOR_TYPES = ("torch.Tensor", "torch.nn.parameter.Parameter")
MAX_SPECIALS = 8


# Where a leaf sits in an entry's encoded arguments: keys and list positions from the top.
LeafPath = tuple[Union[str, int], ...]  # Union: a run-time alias, and Python 3.9's


def tensor_leaves(enc: Any, path: LeafPath) -> Iterator[tuple[LeafPath, dict[str, Any]]]:
    """The tensors of encoded arguments with finite recorded bounds, by path: the ones a fuzz draw can vary."""
    if isinstance(enc, list):
        for i, v in enumerate(enc):
            yield from tensor_leaves(v, path + (i,))
    elif isinstance(enc, dict) and enc.get("type") in TENSOR_TYPES:
        if isinstance(enc.get("shape"), list) and all(isinstance(v, float) or (  # 10**400: the item's skip
                isinstance(v, int) and abs(v) <= sys.float_info.max) for v in (enc.get("Max"), enc.get("Min"))):
            yield path, enc
    elif isinstance(enc, dict) and "type" not in enc:
        for k, v in enc.items():
            yield from tensor_leaves(v, path + (k,))


def replace_leaf(enc: Any, path: LeafPath, new: Any) -> Any:
    """A copy of the encoded arguments with the leaf at `path` replaced (the draw's tensor written in its place)."""
    if not path:
        return new
    head, rest = path[0], path[1:]
    if isinstance(enc, list):
        return [replace_leaf(v, rest, new) if i == head else v for i, v in enumerate(enc)]
    return {k: replace_leaf(v, rest, new) if k == head else v for k, v in enc.items()}


def data_names(enc: Any) -> list[str]:
    """Every saved tensor file an encoded value names (the ones a fuzz dump copies along)."""
    if isinstance(enc, list):
        return [n for v in enc for n in data_names(v)]
    if isinstance(enc, dict):
        own = [enc["data_name"]] if isinstance(enc.get("data_name"), str) else []
        return own + [n for v in enc.values() if isinstance(v, (dict, list)) for n in data_names(v)]
    return []


def leaf_where(path: LeafPath) -> str:
    """A leaf's path as the record spells it: `input_args.0.1`, `input_kwargs.weight`."""
    kind = "input_args" if path[0] == "input_args" else "input_kwargs"
    return ".".join([kind] + [str(p) for p in path[1:]])


def _to(dtype: Any, value: float) -> float:
    import torch

    return float(torch.tensor(value, dtype=torch.float64).to(dtype).double())


def _inside(dtype: Any, value: float, towards: float) -> float:
    """The neighbour of a representable `value` one ULP of `dtype` towards `towards`."""
    import torch

    t = torch.tensor([value], dtype=dtype)
    if dtype in (torch.float32, torch.float64):
        return float(torch.nextafter(t, torch.tensor([towards], dtype=dtype)))
    step = 1 if (towards > value) == (value >= 0) else -1  # magnitude grows when moving away from zero
    if value == 0:
        return float(torch.tensor([1 if towards > 0 else -(2 ** 15) + 1], dtype=torch.int16).view(dtype)) \
            if dtype.itemsize == 2 else value
    bits = t.view(torch.int16) if dtype.itemsize == 2 else t.view(torch.int8)
    return float((bits + step).view(dtype))


def _finite_range(leaf: dict[str, Any], dtype: Any, clamp_zero: bool) -> tuple[float, float]:
    import torch

    from ..inputs.build import finite_range

    def recorded(key: str) -> float:
        """The recorded bound, or the finite one a 1.x dump kept beside it."""
        kept = leaf.get(f"{key}_except_inf_nan")
        return kept if isinstance(kept, (int, float)) and math.isfinite(kept) else float(leaf[key])

    lo, hi = recorded("Min"), recorded("Max")
    flo, fhi = finite_range({}, lo, hi)
    if dtype.is_floating_point:
        info = torch.finfo(dtype)
        flo, fhi = max(flo, info.min), min(fhi, info.max)
        if hi == math.inf:
            fhi = info.max
        if lo == -math.inf:
            flo = -info.max
    if clamp_zero:
        flo, fhi = max(flo, 0.0), max(fhi, 0.0)
    return (fhi, flo) if flo > fhi else (flo, fhi)


@dataclasses.dataclass
class TensorSpace:
    """What may be drawn for one recorded tensor."""

    where: str
    dtype: Any
    shape: list[int]
    lo: float
    hi: float
    edges: list[tuple[float, str]]  # (value, description)

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


def tensor_space(where: str, leaf: dict[str, Any], clamp_zero: bool) -> TensorSpace | None:
    import torch

    from ..inputs.build import InputError, parse_dtype

    try:
        dtype = parse_dtype(leaf.get("dtype"))
    except InputError:
        return None
    shape = leaf["shape"]
    if dtype.is_complex or not all(isinstance(s, int) and s >= 0 for s in shape) or math.prod(shape) == 0:
        return None
    if dtype == torch.bool:
        values = sorted({bool(leaf["Min"]), bool(leaf["Max"])})
        return TensorSpace(where, dtype, shape, float(values[0]), float(values[-1]),
                           [(float(v), f"{v}") for v in values])
    lo, hi = _finite_range(leaf, dtype, clamp_zero)
    edges: list[tuple[float, str]] = []
    if not dtype.is_floating_point:
        lo, hi = float(math.floor(lo)), float(math.floor(hi))
        for value, text in ((hi, "the recorded Max"), (lo, "the recorded Min"), (hi - 1, "Max - 1"),
                            (lo + 1, "Min + 1"), (0.0, "0")):
            if lo <= value <= hi:
                edges.append((value, text))
        return TensorSpace(where, dtype, shape, lo, hi, _unique(edges))
    gen = torch.float32 if dtype.itemsize == 1 else dtype  # float8: drawn in float32, cast once
    lo, hi = _to(dtype, lo), _to(dtype, hi)
    info = torch.finfo(dtype)
    tiny, subnormal = float(info.tiny), float(info.tiny) * float(info.eps)
    candidates = [(hi, "the recorded Max"), (lo, "the recorded Min")]
    if hi > lo and gen is dtype:
        candidates += [(_inside(dtype, hi, lo), "one ULP below the recorded Max"),
                       (_inside(dtype, lo, hi), "one ULP above the recorded Min")]
    candidates += [(0.0, "0"), (-0.0, "-0"), (tiny, "the smallest normal number"),
                   (-tiny, "minus the smallest normal number"), (subnormal, "the smallest subnormal number"),
                   (-subnormal, "minus the smallest subnormal number"), (float(info.max), "the largest finite value"),
                   (-float(info.max), "the lowest finite value")]
    edges = [(v, t) for v, t in candidates if lo <= v <= hi]
    rmax, rmin = leaf.get("Max"), leaf.get("Min")
    if rmax == math.inf:
        edges.append((math.inf, "inf (recorded)"))
    if rmin == -math.inf:
        edges.append((-math.inf, "-inf (recorded)"))
    if any(isinstance(v, float) and math.isnan(v) for v in (rmax, rmin)):
        edges.append((math.nan, "NaN (recorded)"))
    return TensorSpace(where, dtype, shape, lo, hi, _unique(edges))


def _unique(edges: list[tuple[float, str]]) -> list[tuple[float, str]]:
    seen, out = set(), []
    for value, text in edges:
        key = repr(value) if not (isinstance(value, float) and math.isnan(value)) else "nan"
        if key not in seen:
            seen.add(key)
            out.append((value, text))
    return out


def strategy(space: TensorSpace) -> Any:
    from hypothesis import strategies as st

    bases = ["center", "uniform"] + (["edges"] if len(space.edges) > 1 else [])
    if space.dtype.is_floating_point and space.hi > space.lo:
        anywhere = st.floats(min_value=space.lo, max_value=space.hi, allow_nan=False, allow_infinity=False)
    elif space.dtype.is_floating_point:
        anywhere = st.just(space.lo)
    else:
        anywhere = st.integers(int(space.lo), int(space.hi)).map(float)
    values = st.one_of(st.sampled_from([v for v, _ in space.edges]), anywhere) if space.edges else anywhere
    specials = st.lists(st.tuples(st.integers(0, space.numel - 1), values), max_size=min(MAX_SPECIALS, space.numel),
                        unique_by=lambda s: s[0])
    layouts = st.booleans() if len(space.shape) >= 2 and space.shape[-1] > 1 and space.shape[-2] > 1 else st.just(False)
    return st.fixed_dictionaries({"base": st.sampled_from(bases), "seed": st.integers(0, 2 ** 32 - 1),
                                  "specials": specials, "transposed": layouts})


def materialize(space: TensorSpace, recipe: dict[str, Any]) -> Any:
    import torch

    n = space.numel
    g = torch.Generator().manual_seed(recipe["seed"])
    if space.dtype == torch.bool:
        allowed = torch.tensor(sorted({space.lo, space.hi}), dtype=torch.float64)
        if recipe["base"] == "center":
            flat = allowed[0].repeat(n)
        else:
            flat = allowed[torch.randint(0, len(allowed), (n,), generator=g)]
    elif recipe["base"] == "center":
        flat = torch.full((n,), min(max(0.0, space.lo), space.hi), dtype=torch.float64)
    elif recipe["base"] == "uniform" and space.dtype.is_floating_point:
        u = torch.rand(n, dtype=torch.float64, generator=g)
        flat = (u * space.hi).add_((1.0 - u).mul_(space.lo)).clamp_(space.lo, space.hi)
    elif recipe["base"] == "uniform":
        flat = torch.randint(int(space.lo), int(space.hi) + 1, (n,), generator=g, dtype=torch.int64).double()
    else:
        table = torch.tensor([v for v, _ in space.edges], dtype=torch.float64)
        flat = table[torch.randint(0, len(table), (n,), generator=g)]
    for index, value in recipe["specials"]:
        flat[index] = value
    if space.dtype.is_floating_point or space.dtype == torch.bool:
        t = flat.to(space.dtype)
    else:
        t = flat.to(torch.int64).to(space.dtype)
    t = t.reshape(space.shape)
    if recipe["transposed"]:
        t = t.transpose(-1, -2).contiguous().transpose(-1, -2)  # same values, last two dims swapped in memory
    return t


def describe(spaces: list[TensorSpace], example: dict[str, Any]) -> str:
    lines = []
    for space in spaces:
        recipe = example[space.where]
        names = {repr(v): t for v, t in space.edges}
        base = {"center": f"every element {min(max(0.0, space.lo), space.hi):g}",
                "uniform": f"uniform in [{space.lo:g}, {space.hi:g}] (seed {recipe['seed']})",
                "edges": f"edge values (seed {recipe['seed']})"}[recipe["base"]]
        specials = ", ".join(
            f"[{_unravel(i, space.shape)}] = {v!r}" + (f" ({names[repr(v)]})" if repr(v) in names else "")
            for i, v in recipe["specials"])
        layout = "last two dims transposed in memory" if recipe["transposed"] else "contiguous"
        lines.append(f"{space.where} {str(space.dtype).replace('torch.', '')}{list(space.shape)}: {base}, {layout}"
                     + (f"; {specials}" if specials else ""))
    return "\n".join(lines)


def _unravel(index: int, shape: list[int]) -> str:
    out = []
    for size in reversed(shape):
        out.append(index % size)
        index //= size
    return ", ".join(str(i) for i in reversed(out))


ISOLATE_BUDGET = 48  # extra checks spent turning the shrunk example into "a few elements on a plain background"


def isolate(spaces: list[TensorSpace], last: dict[str, Any], run: Any, is_failure: Any) -> dict[str, Any]:
    """Hypothesis shrinks the recipe (base, seed, special elements), but it cannot turn a failing `uniform`
    draw into "every element 0 but these two": keep, per tensor, only the elements that differ from the
    plain background and halve that set while the check still fails (bounded by ISOLATE_BUDGET checks)."""
    import torch

    example = {k: dict(v) for k, v in last["example"].items()}
    best = dict(last)
    budget = [ISOLATE_BUDGET]

    def attempt(candidate: dict[str, Any]) -> bool:
        if budget[0] <= 0:
            return False
        budget[0] -= 1
        record, captured, dump = run(candidate)
        if is_failure(record):
            best.update(example=candidate, record=record, captured=captured, dump=dump)
            return True
        return False

    for space in spaces:
        recipe = example[space.where]
        if recipe["base"] == "center":
            continue
        flat = materialize(space, recipe).reshape(-1).double()
        center = min(max(0.0, space.lo), space.hi)
        differing = torch.nonzero((flat != center) | torch.isnan(flat)).reshape(-1).tolist()
        keep = differing

        def with_only(indices: list[int]) -> dict[str, Any]:  # called within this iteration only (B023 noqa below)
            new = dict(best["example"])
            new[space.where] = {"base": "center", "seed": 0, "transposed": recipe["transposed"],  # noqa: B023
                                "specials": [(i, float(flat[i])) for i in indices]}  # noqa: B023
            return new

        if not attempt(with_only(keep)):
            continue  # the background matters (e.g. a reduction over all of it): keep the recipe
        while len(keep) > 1 and budget[0] > 0:
            half = len(keep) // 2
            for part in (keep[:half], keep[half:]):
                if attempt(with_only(part)):
                    keep = part
                    break
            else:
                break
        example = best["example"]
    return best
