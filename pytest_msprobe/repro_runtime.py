# ---------------------------------------------------------------------------------------------------
# pytest-msprobe repro runtime. This file is copied verbatim into every script `--msprobe-repro` writes,
# so it must stay standalone: the standard library and torch only (torch_npu on an NPU host,
# bench_functions for NPU.* ops). It never imports pytest_msprobe or numpy.
#
# It replays one item as pytest-msprobe ran it: the same arguments (after msprobe's dtype fixes and
# HF32 rounding), each side on its own copies, the device in the recorded dtype (autocast as recorded),
# the CPU bench with msprobe's precision raise, the strict reference runs, the backward with the same
# cotangents. Then it recomputes, per output: Layer 1 (cosine, max abs error, 双百/双千/双万, status),
# the worst element, the strict standard's statistics and verdict, and binary consistency; each written
# out below in torch, with the dtypes and the order of operations of pytest_msprobe's numpy code, so
# the numbers equal the item's (summation order aside: ~1e-16 relative).
# MAINTAINERS: this mirrors check.py, execution.py, standards.py and strict.py; a change there (the
# strict reference, a metric) must be made here too. tests/test_errordata_repro.py and
# tests/test_red_to_fix.py compare the two and fail when they drift.
# ---------------------------------------------------------------------------------------------------
import base64
import io
import json
import math
import os
import sys
import traceback

import torch

MSG_EMPTY = "There is not bench calculation result."
_LOW = tuple(getattr(torch, n) for n in ("bfloat16", "float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz",
                                          "float8_e5m2fnuz") if hasattr(torch, n))
_FLOATS = {torch.float16: torch.float16, torch.float32: torch.float32, torch.float64: torch.float64}
_FORMATS = {"torch.float16": (10, -14), "torch.bfloat16": (7, -126), "torch.float32": (23, -126),
            "torch.float64": (52, -1022)}


# ------------------------------------------------------------------------------------------- inputs

class DeviceArg:
    """A recorded `device=` value: the device side gets its device, the bench drops it."""

    def __init__(self, recorded):
        self.recorded = recorded


def load_tensors(blob, file_name, here):
    tensors = {}
    if blob:
        tensors.update(torch.load(io.BytesIO(base64.b64decode(blob)), map_location="cpu", weights_only=True))
    if file_name:
        tensors.update(torch.load(os.path.join(here, file_name), map_location="cpu", weights_only=True))
    return tensors


def decode(value, tensors):
    if isinstance(value, list):
        return [decode(v, tensors) for v in value]
    if not isinstance(value, dict):
        return value
    (tag, inner), = value.items()
    if tag == "__tensor__":
        return tensors[inner]
    if tag == "__ndarray__":
        return tensors[inner].numpy()
    if tag == "__tuple__":
        return tuple(decode(v, tensors) for v in inner)
    if tag == "__dict__":
        return {k: decode(v, tensors) for k, v in inner.items()}
    if tag == "__float__":
        return float(inner)
    if tag == "__slice__":
        return slice(*inner)
    if tag == "__ellipsis__":
        return Ellipsis
    if tag == "__size__":
        return torch.Size(inner)
    if tag == "__dtype__":
        return getattr(torch, inner)
    if tag == "__memory_format__":
        return getattr(torch, inner)
    if tag == "__device__":
        return DeviceArg(inner)
    raise ValueError("unknown encoded value %r" % (value,))


def map_structure(fn, value):
    if isinstance(value, list):
        return [map_structure(fn, v) for v in value]
    if isinstance(value, tuple):
        return tuple(map_structure(fn, v) for v in value)
    if isinstance(value, dict):
        return {k: map_structure(fn, v) for k, v in value.items()}
    return fn(value)


# ------------------------------------------------------------------------------------------- the API

def _getitem(self, index):
    """msprobe's indexing rules for tensor indices, applied identically on both sides."""
    if isinstance(index, torch.Tensor):
        if index.dtype == torch.uint8:
            index = index.bool()
        if index.dtype == torch.bool:
            if index.shape == self.shape:
                return torch.masked_select(self, index)
            return self[index.nonzero(as_tuple=True)]
        if index.dim() <= 1:
            return self[index.tolist()]
        return torch.stack([_getitem(self, row) for row in index])
    return self[index]


def _eq(self, other):
    return False if other is None else torch.Tensor.__eq__(self, other)


def _attr(root, dotted):
    for part in dotted.split("."):
        root = getattr(root, part)
    return root


def resolve(spec, device_kind):
    """(device function, bench function) as pytest-msprobe resolves them."""
    api_type, api = spec["api_type"], spec["api_name"]
    if api_type == "Functional":
        fn = _attr(torch.nn.functional, api)
        return fn, fn
    if api_type == "Torch":  # the function the item resolved (msprobe's Torch.inv is torch.linalg.inv)
        function = spec.get("function") or ""
        fn = _attr(torch, function[len("torch."):] if function.startswith("torch.") else api)
        return fn, fn
    if api_type == "Tensor":
        fn = {"__getitem__": _getitem, "__eq__": _eq}.get(api) or getattr(torch.Tensor, api)
        return fn, fn
    if api_type == "NPU":
        import bench_functions  # installed with pytest-msprobe: the pure-torch references of fused NPU ops
        bench = bench_functions.get(spec["bench_name"])
        if device_kind == "npu":
            import torch_npu
            return _attr(torch_npu, api), bench
        return bench, bench
    raise SystemExit("API type %s cannot be replayed" % api_type)


def load_kernel(kernels, key):
    """The --msprobe-kernels kernel the item's device side ran (`module:attr` or `path/file.py:attr`)."""
    import importlib
    import importlib.util
    module, _, attr = kernels.rpartition(":")
    if module.endswith(".py"):
        sys.path.insert(0, os.path.dirname(os.path.abspath(module)))
        found = importlib.util.spec_from_file_location(os.path.splitext(os.path.basename(module))[0], module)
        mod = importlib.util.module_from_spec(found)
        found.loader.exec_module(mod)
    else:
        mod = importlib.import_module(module)
    fn = _attr(mod, attr)[key]
    if isinstance(fn, str):
        name, _, inner = fn.partition(":")
        fn = _attr(importlib.import_module(name), inner)
    return fn


def select_device(name):
    kind = name.split(":")[0]
    if kind == "npu":
        import torch_npu  # noqa: F401  (registers the npu device)
    return name, kind


def synchronize(kind):
    if kind == "cuda":
        torch.cuda.synchronize()
    elif kind == "npu":
        torch.npu.synchronize()


# ------------------------------------------------------------------------------------------- sides

class Side:
    def __init__(self):
        self.args, self.kwargs, self.grad_leaves = [], {}, []


def make_side(args, kwargs, device, dtype_for, requires_grad, want_grad, bench):
    side = Side()
    counter = [0]

    def convert(v, key=None):
        if isinstance(v, DeviceArg):
            return "cpu" if bench else device
        if not isinstance(v, torch.Tensor):
            return v
        position = counter[0]
        counter[0] += 1
        t = v.detach().to(device=device, dtype=dtype_for(v), copy=True)
        if want_grad and id(v) in requires_grad and key != "out" and t.dtype.is_floating_point:
            leaf = t.requires_grad_(True)
            side.grad_leaves.append((position, leaf))
            return leaf.clone()
        return t

    side.args = [map_structure(convert, a) for a in args]
    for key, value in kwargs.items():
        if key == "device" and isinstance(value, DeviceArg) and bench:
            continue
        side.kwargs[key] = map_structure(lambda x, k=key: convert(x, k), value)
    return side


def run_side(fn, side, autocast, device_type, grad):
    with (torch.enable_grad() if grad else torch.no_grad()):
        if autocast is not None:
            with torch.autocast(device_type=device_type, dtype=autocast):
                return fn(*side.args, **side.kwargs)
        return fn(*side.args, **side.kwargs)


def output_leaves(value):
    out = []

    def walk(v):
        if isinstance(v, (list, tuple)) and not isinstance(v, torch.Size):
            for x in v:
                walk(x)
        elif isinstance(v, dict):
            for x in v.values():
                walk(x)
        else:
            out.append(v)

    walk(value)
    return out


def pair_cotangents(outputs, cotangents, grad_index):
    differentiable = [i for i, o in enumerate(outputs) if isinstance(o, torch.Tensor) and o.requires_grad]
    if grad_index is not None:
        cot = cotangents[grad_index] if len(cotangents) == len(outputs) else (cotangents[0] if cotangents else None)
        return [(grad_index, cot)] if cot is not None and grad_index in differentiable else []
    if len(outputs) == 1:
        return [(0, cotangents[0])] if cotangents and cotangents[0] is not None and differentiable else []
    if len(cotangents) == len(outputs):
        return [(i, c) for i, c in enumerate(cotangents) if c is not None and i in differentiable]
    raise SystemExit("%d outputs but %d recorded gradients and no grad_index" % (len(outputs), len(cotangents)))


def backward(outputs, pairs, device):
    tensors, grads = [], []
    for index, cot in pairs:
        out = outputs[index]
        tensors.append(out)
        grads.append(cot.detach().to(device=device, dtype=out.dtype).reshape(out.shape))
    torch.autograd.backward(tensors, grads)


# ------------------------------------------------------------------------------------------- Layer 1

def _numpy_like(x):
    """The values pytest-msprobe compares: bf16/fp8 as float32 (numpy has no such dtypes)."""
    t = x.detach().cpu().resolve_conj()
    return (t.float() if t.dtype in _LOW else t), str(t.dtype)


def _max_abs(x):
    return torch.maximum(x.max(), -x.min())


def _first_argmax(x):
    nan = torch.isnan(x)
    if bool(nan.any()):
        return int(nan.nonzero()[0, 0])
    return int(torch.argmax(x))


def cosine(b, d, l1, bench_absmax):
    n, g = d.reshape(-1), b.reshape(-1)
    if n.numel() == 0:
        return None, False
    if n.numel() == 1:
        return None, True
    n_max, g_max = float(_max_abs(n)), float(bench_absmax)
    eps = l1["cosine"]["zero_eps"]
    if n_max <= eps and g_max <= eps:
        return None, True
    if n_max <= eps or g_max <= eps:
        return None, False
    ng = nn = gg = 0.0
    block = 1 << 20
    for i in range(0, n.numel(), block):
        nb = n[i:i + block].double() / n_max
        gb = g[i:i + block].double() / g_max
        ng += float(torch.dot(nb, gb))
        nn += float(torch.dot(nb, nb))
        gg += float(torch.dot(gb, gb))
    cos = ng / (math.sqrt(nn) * math.sqrt(gg))
    if math.isnan(cos):
        return float("nan"), False
    cos = min(max(cos, -1.0), 1.0)
    return cos, cos > l1["cosine"]["pass_gt"]


def _in_dtype(value, dtype):
    return float(torch.tensor(value, dtype=dtype))


def _dual(rel, t):
    ratio = 1.0 if rel.numel() == 0 else int((rel < _in_dtype(t, rel.dtype)).sum()) / rel.numel()
    return ratio, ratio > 1 - t


def compare_tensor(name, bench, device, th, algorithm=None):
    """pytest_msprobe.standards.compare_tensor, Layer 1 and the worst element."""
    b, bench_dtype = _numpy_like(bench)
    d, device_dtype = _numpy_like(device)
    row = {"name": name, "status": "error", "device_dtype": device_dtype, "bench_dtype": bench_dtype,
           "shape": list(d.shape), "metrics": {}, "worst": None, "message": ""}
    if b.shape != d.shape:
        row["message"] = "shape of bench %s and device %s differ" % (tuple(b.shape), tuple(d.shape))
        return row, None
    groups = ({torch.float16, torch.float32, torch.float64}, {torch.bool, torch.uint8}, {torch.int32, torch.int64})
    if not any(b.dtype in g and d.dtype in g for g in groups):
        row["message"] = "bench dtype %s, device dtype %s: cannot compare" % (b.dtype, d.dtype)
        return row, None
    if b.numel() == 0:
        row["message"] = MSG_EMPTY
        return row, None
    if not b.dtype.is_floating_point:
        rate = int((b != d).sum()) / b.numel()
        row["metrics"]["binary_error_rate"] = rate
        row["status"] = "pass" if rate == 0 else "error"
        return row, None
    b, d = b.reshape(-1), d.reshape(-1)
    if d.dtype == torch.float16 and b.dtype != torch.float16:
        d = d.float()
    eps = th["rel_err_eps"].get(device_dtype)
    eps = torch.finfo(b.dtype).eps if eps is None else eps
    abs_bench = b.abs()
    abs_err = (d - b).abs()
    rel_err = (abs_err / (abs_bench + eps)).to(b.dtype)
    worst = _first_argmax(abs_err)
    index = []
    rest = worst
    for size in reversed(row["shape"]):
        index.append(rest % size)
        rest //= size
    row["worst"] = {"index": index[::-1], "device": float(d[worst]), "bench": float(b[worst]),
                    "abs_err": float(abs_err[worst]), "rel_err": float(rel_err[worst])}
    l1, m = th["layer1"], row["metrics"]
    if algorithm == "binary_consistency":  # the Layer-2 column of the item's algorithm
        m["binary_error_rate"] = int((b != d).sum()) / b.numel()
    elif algorithm == "thousandth_threshold":
        m["dual_thousandth"] = _dual(rel_err, l1["dual_ratio"]["thousandth"])[0]
    cos, ok = cosine(b, d, l1, abs_bench.max())
    m["cosine"] = cos
    if not ok:
        row["status"] = "error"
        return row, (b, d)
    max_abs = float(abs_err[worst])
    m["max_abs_err"] = max_abs
    if max_abs < _in_dtype(l1["max_abs_err_pass_lt"], abs_err.dtype):
        row["status"] = "pass"
        return row, (b, d)
    t = l1["dual_ratio"]
    if device_dtype in l1["half_dtypes"]:
        m["dual_hundredth"], ok100 = _dual(rel_err, t["hundredth"])
        if not ok100:
            row["status"] = "error"
            return row, (b, d)
        m["dual_thousandth"], ok1000 = _dual(rel_err, t["thousandth"])
        row["status"] = "pass" if ok1000 else "Warning"
        return row, (b, d)
    m["dual_thousandth"], ok1000 = _dual(rel_err, t["thousandth"])
    m["dual_ten_thousandth"], ok10000 = _dual(rel_err, t["ten_thousandth"])
    row["status"] = "pass"
    if device_dtype in l1["full_dtypes"]:
        row["status"] = "error" if not ok1000 else ("Warning" if not ok10000 else "pass")
    return row, (b, d)


# ------------------------------------------------------------------------------------------- strict

def _to_half(v):
    """float64 -> float16 correctly rounded (via float32 rounded to odd: no double rounding)."""
    f = v.float()
    fd = f.double()
    inexact = (fd != v) & torch.isfinite(v)
    toward_zero = inexact & (fd.abs() > v.abs())
    f = torch.where(toward_zero, torch.nextafter(f, torch.zeros_like(f)), f)
    bits = f.view(torch.int32)
    f = torch.where(inexact, bits | 1, bits).view(torch.float32)
    return f.half()


def round_to(v, dtype):
    if dtype == "torch.float16":
        return _to_half(v).double()
    if dtype == "torch.float32":
        return v.float().double()
    if dtype == "torch.bfloat16":
        bits = v.float().view(torch.int32)
        rounded = (bits + (((bits >> 16) & 1) + 0x7FFF)) & -65536
        return torch.where(torch.isfinite(v), rounded, bits).view(torch.float32).double()
    return v.double()


def _pow2(k):
    normal = (k + 1023).clamp(min=1) << 52
    sub = torch.ones_like(k) << (k + 1074).clamp(min=0, max=51)
    return torch.where(k >= -1022, normal, sub).view(torch.float64)


def ulp(values, dtype):
    mantissa, emin = _FORMATS[dtype]
    _, exponent = torch.frexp(values.abs())
    return _pow2(torch.clamp(exponent.long() - 1, min=emin) - mantissa)


def quantile(values, q):
    """numpy.quantile(values, q) (method 'linear'), including numpy's two-sided lerp."""
    v = torch.sort(values.reshape(-1)).values
    n = v.numel()
    virtual = q * (n - 1)
    prev = math.floor(virtual)
    nxt = min(prev + 1, n - 1)
    gamma = virtual - prev
    a, b = float(v[prev]), float(v[nxt])
    diff = b - a
    return b - diff * (1 - gamma) if gamma >= 0.5 else a + diff * gamma


def _balance(diff):
    up, down = int((diff > 0).sum()), int((diff < 0).sum())
    n = up + down
    return abs(up - down) / math.sqrt(n) if n else 0.0


def _distinct(bench, other):
    keys = (bench.view(torch.int64) * -7046029254386353131) ^ other.view(torch.int64)
    uniq, inverse = torch.unique(keys, return_inverse=True)
    first = torch.full((uniq.numel(),), keys.numel(), dtype=torch.int64)
    return first.scatter_reduce_(0, inverse, torch.arange(keys.numel()), reduce="amin")


def _signed_mean(errors, unit):
    return float(torch.clamp(errors / unit, -1.0, 1.0).mean())


def strict_compare(b, d, r, dtype, rules, sens):
    rounded = round_to(b, dtype)

    def mismatch(x):
        nan_x, nan_b, inf_x, inf_b = torch.isnan(x), torch.isnan(rounded), torch.isinf(x), torch.isinf(rounded)
        return (nan_x != nan_b) | (inf_x != inf_b) | (inf_x & inf_b & (torch.sign(x) != torch.sign(rounded)))

    bad_dev, bad_ref = mismatch(d), mismatch(r)
    same = bad_dev & bad_ref & ((d == r) | (torch.isnan(d) & torch.isnan(r)))
    bad = bad_dev & ~same
    stats = {"nonfinite_mismatch": float(bad.sum())}
    if bool(bad.any()):
        return "error", "NaN/inf mismatch at %d of %d elements" % (int(bad.sum()), d.numel()), stats
    finite = torch.isfinite(d) & torch.isfinite(rounded) & torch.isfinite(r) & torch.isfinite(b)
    if not bool(finite.any()):
        return "pass", "no finite elements; non-finite positions match", stats
    b, d, r, rounded = b[finite], d[finite], r[finite], rounded[finite]
    err_d, err_r = (d - b).abs(), (r - b).abs()
    unit = ulp(rounded, dtype)
    floor = quantile(torch.clamp(err_r - unit, min=0.0), rules["noise_quantile"])
    scale = torch.clamp(unit, min=floor)
    if sens is not None:
        scale = torch.maximum(scale, rules["sensitivity_factor"] * torch.nan_to_num(sens[finite], nan=0.0, posinf=0.0))
    w = torch.where(d == rounded, torch.zeros_like(err_d), err_d / scale)
    wr = torch.where(r == rounded, torch.zeros_like(err_r), err_r / scale)
    stats.update(max_err=float(w.max()), mean_err=float(w.mean()), ref_max_err=float(wr.max()),
                 ref_mean_err=float(wr.mean()), noise_floor=floor)
    n_max = int(rules["bias_max_samples"])
    if b.numel() > n_max:
        step = (b.numel() - 1) / (n_max - 1)
        pick = torch.arange(n_max, dtype=torch.float64) * step
        pick[-1] = b.numel() - 1
        pick = pick.long()
        b, d, r, unit = b[pick], d[pick], r[pick], unit[pick]
    towards_zero = -torch.sign(b)
    for side, values in (("", d), ("ref_", r)):
        error = values - b
        distinct = _distinct(b, values)
        stats[side + "bias_z"] = _balance(error[distinct])
        stats[side + "bias_zero_z"] = _balance((error * towards_zero)[distinct])
        stats[side + "bias"] = _signed_mean(error, unit)
        stats[side + "bias_zero"] = _signed_mean(error * towards_zero, unit)
    problems = []
    gross_limit = max(rules["gross_ulp"], rules["gross_ref_factor"] * stats["ref_max_err"])
    if bool((w > gross_limit).any()):
        problems.append("%d of %d elements exceed %.3g ULP (worst %.3g ULP)"
                        % (int((w > gross_limit).sum()), w.numel(), gross_limit, stats["max_err"]))
    mean_limit = rules["mean_ref_factor"] * stats["ref_mean_err"] + rules["mean_slack_ulp"]
    if w.numel() >= rules["mean_min_elements"] and stats["mean_err"] > mean_limit:
        problems.append("mean error %.3g ULP > %.3g" % (stats["mean_err"], mean_limit))
    for key, what in (("bias", "biased in one direction"), ("bias_zero", "biased towards or away from zero")):
        z_limit = max(rules["bias_z"], rules["bias_ref_factor"] * stats["ref_" + key + "_z"])
        size_limit = rules["bias_min_ulp"] + abs(stats["ref_" + key])
        if stats[key + "_z"] > z_limit and abs(stats[key]) > size_limit:
            problems.append("errors %s: mean signed error %.3g ULP" % (what, stats[key]))
    return ("error" if problems else "pass"), "; ".join(problems), stats


def strict_rules(rules, dtype):
    flat = {k: v for k, v in rules.items() if not isinstance(v, dict)}
    specific = rules.get(dtype)
    return dict(flat, **specific) if isinstance(specific, dict) else flat


# ------------------------------------------------------------------------------------------- compare

def compare(spec, prefix, bench, device, refs, positions):
    th, standard = spec["thresholds"], spec["standard"]
    if spec.get("dropout"):
        b = next(x for x in bench if isinstance(x, torch.Tensor))
        d = next(x for x in device if isinstance(x, torch.Tensor))
        rule = th["dropout"]
        diff = abs(int((b == 0).sum()) - int((d == 0).sum())) / b.numel()
        ok = b.numel() < rule["min_numel"] or diff < rule["zero_fraction_diff_lt"]
        return [{"name": prefix + ".0", "status": "pass" if ok else "error", "verdict": None, "metrics": {},
                 "worst": None, "message": "dropout zero-fraction difference %.6g" % diff}]
    if len(bench) > len(device):
        return [{"name": prefix + ".0", "status": "error", "verdict": "error", "metrics": {}, "worst": None,
                 "message": "bench and npu output structure is different."}]
    ref = None
    if refs:
        ref = [r.detach().to(d.dtype) if isinstance(r, torch.Tensor) and isinstance(d, torch.Tensor)
               and r.dtype != d.dtype and r.is_floating_point() and d.is_floating_point() else r
               for r, d in zip(refs[0], device)]
    sens = None
    if len(refs) > 1:
        sens = [_sensitivity([run[i] for run in refs[1:]], refs[0][i]) for i in range(len(refs[0]))]
    rows = []
    for i, (b, d) in enumerate(zip(bench, device)):
        name = "%s.%d" % (prefix, positions[i] if positions is not None and i < len(positions) else i)
        if b is None or d is None or not isinstance(b, torch.Tensor) or not isinstance(d, torch.Tensor):
            if isinstance(b, torch.Tensor) != isinstance(d, torch.Tensor) or type(b) is not type(d):
                row = {"name": name, "status": "error", "message": "bench and npu output type is different."}
            elif b is None:
                row = {"name": name, "status": "SKIP", "message": "Bench output is None, skip this test."}
            else:
                row = {"name": name, "status": "pass" if b == d else "error", "message": ""}
            row.update(metrics={}, worst=None, verdict=row["status"])
            rows.append(row)
            continue
        expected = _expected_output(spec, name)
        algorithm = expected.get("algorithm") if expected else None
        row, arrays = compare_tensor(name, b, d, th, algorithm)
        row["verdict"] = row["status"]
        r = ref[i] if ref is not None and i < len(ref) else None
        if row["status"] != "SKIP" and standard == "strict" and d.is_floating_point() and b.shape == d.shape \
                and row["device_dtype"] in _FORMATS and (r is None or (isinstance(r, torch.Tensor)
                                                                       and r.shape == d.shape)):
            b64 = b.detach().cpu().double()
            d64 = d.detach().cpu().double()
            r64 = round_to(b64, row["device_dtype"]) if r is None else r.detach().cpu().double()
            s64 = None if sens is None or sens[i] is None else sens[i].detach().cpu().double()
            verdict, message, stats = strict_compare(b64.reshape(-1), d64.reshape(-1), r64.reshape(-1),
                                                     row["device_dtype"],
                                                     strict_rules(th["strict"], row["device_dtype"]),
                                                     None if s64 is None else s64.reshape(-1))
            row.update(verdict=verdict, verdict_message=message, strict=stats)
        elif standard in ("msprobe", "msprobe26") and row["status"] != "SKIP":
            if "binary_error_rate" in row["metrics"]:
                rate = row["metrics"].get("binary_error_rate")
                row["verdict"] = "pass" if rate == 0 else "error"
            elif algorithm == "thousandth_threshold" and row["metrics"].get("dual_thousandth") is not None:
                ok = row["metrics"]["dual_thousandth"] >= th["thousandth_verdict"]["pass_if_fraction_ge"]
                row["verdict"] = "pass" if ok else "error"
            elif expected and expected.get("compare"):
                row["verdict"] = expected.get("verdict")
                row["verdict_recorded"] = True  # a Layer-2 algorithm this script does not recompute
        rows.append(row)
    return rows


def _sensitivity(runs, ref):
    """RMS of the perturbed runs' changes, by hypot in the outputs' dtype (as check._sensitivity)."""
    if not isinstance(ref, torch.Tensor) or not ref.is_floating_point() or not runs or any(
            not isinstance(r, torch.Tensor) or r.shape != ref.shape or not r.is_floating_point() for r in runs):
        return None
    work = torch.promote_types(ref.dtype, torch.float32)
    acc = None
    for run in runs:
        diff = run.detach().to(work) - ref.detach().to(work)
        acc = diff.abs_() if acc is None else torch.hypot(acc, diff, out=acc)
    return acc.div_(math.sqrt(len(runs)))


def _expected_output(spec, name):
    for out in spec["expected"].get("outputs", []):
        if out.get("name") == name:
            return out
    return None


def aggregate(statuses):
    seen = set(statuses)
    for status in ("error", "Warning", "pass"):
        if status in seen:
            return status
    return "SKIP"


# ------------------------------------------------------------------------------------------- run

def replay(spec, tensors, device_name=None):
    """Run the item once; return {'status', 'outputs': [...]} like the item's record."""
    args = decode(spec["args"], tensors)
    kwargs = {k: decode(v, tensors) for k, v in spec["kwargs"].items()}
    cotangents = decode(spec["cotangents"], tensors)
    requires_grad = {id(tensors[k]) for k in spec["requires_grad"]}
    device, kind = select_device(device_name or spec["device"])
    device_fn, bench_fn = resolve(spec, kind)
    if spec.get("kernels"):
        device_fn = load_kernel(spec["kernels"], spec["api_type"] + "." + spec["api_name"])
    plan = spec["plan"]
    raise_to = getattr(torch, plan["raise_to"].split(".")[1]) if plan["raise_to"] else None
    autocast = getattr(torch, plan["autocast"].split(".")[1]) if plan["autocast"] else None
    raisable = (torch.float16, torch.bfloat16, torch.float32)
    want_grad = spec["direction"] == "backward"

    def bench_dtype(t):
        if raise_to is None or t.dtype not in raisable or (plan["hf32"] and t.dtype == torch.float32):
            return t.dtype
        return raise_to

    dev_side = make_side(args, kwargs, device, lambda t: t.dtype, requires_grad, want_grad, False)
    bench_side = make_side(args, kwargs, "cpu", bench_dtype, requires_grad, want_grad, True)
    ref_sides, ref_fn, ref_device, ref_autocast, perturb = _reference(spec, args, kwargs, requires_grad, want_grad,
                                                                      autocast, bench_fn)
    torch.manual_seed(spec["seed"])
    try:
        out_d = run_side(device_fn, dev_side, autocast, kind, want_grad)
        synchronize(kind)
    except Exception as exc:
        traceback.print_exc()
        return {"status": "error", "message": "device run raised %s: %s" % (type(exc).__name__, exc), "outputs": []}
    out_b = run_side(bench_fn, bench_side, None, "cpu", want_grad)
    leaves_d, leaves_b = _selected(spec, output_leaves(out_d)), _selected(spec, output_leaves(out_b))
    if spec.get("npu_postprocess"):
        from bench_functions import postprocess
        leaves_d = postprocess(spec["api_name"], leaves_d, args, kwargs, "device")
        leaves_b = postprocess(spec["api_name"], leaves_b, args, kwargs, "bench")
    ref_leaves = []
    for side in ref_sides:
        ref_leaves.append(_selected(spec, output_leaves(run_side(ref_fn, side, ref_autocast, ref_device.split(":")[0],
                                                                 want_grad))))
    prefix = spec["api"] + "." + spec["direction"] + ".output"
    if not want_grad:
        rows = compare(spec, prefix, leaves_b, leaves_d, ref_leaves, None)
    else:
        pairs_b = pair_cotangents(leaves_b, cotangents, spec["grad_index"])
        pairs_d = pair_cotangents(leaves_d, cotangents, spec["grad_index"])
        backward(leaves_b, pairs_b, "cpu")
        backward(leaves_d, pairs_d, device)
        synchronize(kind)
        ref_grads = []
        for k, (leaves_r, side) in enumerate(zip(ref_leaves, ref_sides)):
            # the perturbed twins move the recorded gradients too: they are inputs of the backward
            moved = cotangents if k == 0 or perturb is None else [perturb(c) for c in cotangents]
            backward(leaves_r, pair_cotangents(leaves_r, moved, spec["grad_index"]), ref_device)
            ref_grads.append([leaf.grad for _, leaf in side.grad_leaves])
        rows = compare(spec, prefix, [leaf.grad for _, leaf in bench_side.grad_leaves],
                       [leaf.grad for _, leaf in dev_side.grad_leaves], ref_grads,
                       [pos for pos, _ in dev_side.grad_leaves])
    return {"status": aggregate(r["verdict"] or r["status"] for r in rows), "outputs": rows}


def _selected(spec, leaves):
    chosen = spec.get("selected_outputs")
    return leaves if chosen is None else [leaves[i] for i in chosen if i < len(leaves)]


def _reference(spec, args, kwargs, requires_grad, want_grad, autocast, bench_fn):
    """The third run(s): --msprobe-reference device, or strict's fp32 reference and its perturbed twins."""
    ref_device = spec.get("reference_device")
    if ref_device:
        name, kind = select_device(ref_device)
        fn, _ = resolve(spec, kind)
        side = make_side(args, kwargs, name, lambda t: t.dtype, requires_grad, want_grad, False)
        return [side], fn, name, autocast, None
    if spec["standard"] != "strict":
        return [], None, "cpu", None, None

    def compute_dtype(t):
        return torch.float32 if t.dtype in (torch.float16, torch.bfloat16) else t.dtype

    generator = torch.Generator().manual_seed(0x5EED)

    def perturb(v):
        if not isinstance(v, torch.Tensor) or not v.is_floating_point():
            return v
        t = v.to(compute_dtype(v))
        signs = torch.randint(0, 2, t.shape, generator=generator).to(t.dtype) * 2 - 1
        moved = t * (1 + torch.finfo(v.dtype).eps / 2 * signs)
        if id(v) in requires_grad:
            requires_grad.add(id(moved))
        return moved

    inputs = [(args, kwargs)] + [(map_structure(perturb, args), map_structure(perturb, kwargs))
                                 for _ in range(spec["perturbed_runs"])]
    sides = [make_side(a, k, "cpu", compute_dtype, requires_grad, want_grad, True) for a, k in inputs]
    return sides, bench_fn, "cpu", None, perturb


# ------------------------------------------------------------------------------------------- report

NUMBERS = ("cosine", "max_abs_err", "dual_hundredth", "dual_thousandth", "dual_ten_thousandth", "binary_error_rate")
STRICT_NUMBERS = ("max_err", "mean_err", "ref_max_err", "ref_mean_err", "noise_floor", "bias_z", "bias",
                  "bias_zero_z", "bias_zero", "nonfinite_mismatch")


def _same(a, b, rel=1e-9):
    if a is None or b is None:
        return a is None and b is None
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return a == b or abs(a - b) <= rel * max(abs(a), abs(b))
    return a == b


def differences(result, expected):
    """What differs from the numbers the item reported (empty: the same)."""
    found = []
    if result["status"] != expected.get("status"):
        found.append("status %s, item %s" % (result["status"], expected.get("status")))
    by_name = {o["name"]: o for o in expected.get("outputs", [])}
    for row in result["outputs"]:
        exp = by_name.get(row["name"])
        if exp is None:
            found.append("%s: not in the item's record" % row["name"])
            continue
        for key in NUMBERS:
            mine, theirs = row["metrics"].get(key), (exp.get("metrics") or {}).get(key)
            if not _same(mine, theirs):
                found.append("%s %s: %r, item %r" % (row["name"], key, mine, theirs))
        if (row.get("worst") or {}).get("index") != (exp.get("worst") or {}).get("index"):
            found.append("%s worst element differs" % row["name"])
        for key in STRICT_NUMBERS if "strict" in row else ():
            mine, theirs = row["strict"].get(key), (exp.get("reference") or {}).get(key)
            if not _same(mine, theirs):
                found.append("%s strict %s: %r, item %r" % (row["name"], key, mine, theirs))
        if (row["verdict"] or row["status"]) != (exp.get("verdict") or exp.get("status")):
            found.append("%s verdict %s, item %s" % (row["name"], row["verdict"], exp.get("verdict")))
    return found


def _fmt(v):
    if v is None:
        return "-"
    if isinstance(v, float):
        return "%.10g" % v
    return str(v)


def main(spec, tensors, argv=None):
    import argparse

    parser = argparse.ArgumentParser(description="Replay %s (%s) as pytest-msprobe ran it."
                                     % (spec["api"] + "." + spec["direction"], spec["item"]))
    parser.add_argument("--device", default=None, help="device under test (default: %s)" % spec["device"])
    parser.add_argument("--json", action="store_true", help="print the result as one JSON object")
    opts = parser.parse_args(argv)
    result = replay(spec, tensors, opts.device)
    found = differences(result, spec["expected"])
    result["same_as_item"] = not found
    result["differences"] = found
    if opts.json:
        print(json.dumps(result, allow_nan=True))
    else:
        print("%s.%s  standard=%s  device=%s  seed=%s" % (spec["api"], spec["direction"], spec["standard"],
                                                         opts.device or spec["device"], spec["seed"]))
        for row in result["outputs"]:
            m = row["metrics"]
            print("  %s  %s -> %s" % (row["name"], row.get("device_dtype", "-"), row["verdict"] or row["status"]))
            print("    " + "  ".join("%s=%s" % (k, _fmt(m.get(k))) for k in NUMBERS if m.get(k) is not None))
            if row.get("worst"):
                w = row["worst"]
                print("    worst element %s: device %s, bench %s (abs err %s, rel err %s)"
                      % (w["index"], _fmt(w["device"]), _fmt(w["bench"]), _fmt(w["abs_err"]), _fmt(w["rel_err"])))
            if row.get("strict"):
                print("    strict: " + "  ".join("%s=%s" % (k, _fmt(row["strict"].get(k))) for k in STRICT_NUMBERS
                                                 if k in row["strict"]))
            if row.get("verdict_message"):
                print("    " + row["verdict_message"])
            if row.get("verdict_recorded"):
                print("    verdict of the item's %s algorithm (not recomputed here)"
                      % (_expected_output(spec, row["name"]) or {}).get("algorithm"))
        print("verdict: %s (the item reported %s)" % (result["status"], spec["expected"].get("status")))
        print("same numbers as the item: " + ("yes" if not found else "NO\n  " + "\n  ".join(found)))
    return 1 if result["status"] == "error" else 0
