"""The third run of an item: what a correct kernel may lose, learnt beside the bench.

With --msprobe-reference it is that device's run in the recorded dtype (msprobe's GPU leg). Under the
`strict` standard it is torch's own kernel on CPU in the recorded dtype, or, for contractions, the
magnitude run (the API on the absolute values of its inputs); for a fused NPU op, its reference with
the roundings a sound 16-bit kernel makes (bench_functions.get_rounded). torch's 16-bit conv and attention
backward kernels are slow on CPU, so their run covers sampled rows, and `ReferenceRun.complete`
estimates the others from them (error_model.yaml sampled_torch_run). Also the bench-side helpers the
error model needs: a contraction's product before its bias, and inputs rounded as an autocast kernel
saw them.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple, cast

import torch

from ..settings import CheckOptions
from ..specs.loader import error_kind, in_list
from .backends import select as select_device
from .execution import Device, Shared, Side, Target, make_side, map_structure, resolve
from .memory import cpu_empty_like
from .term_sizes import term_size_fn


@dataclass
class ReferenceRun:
    """The third run: a reference device's or torch's own kernel in the device dtype (`role` "torch"),
    or, for contractions under `strict`, the API on the absolute values of its inputs ("magnitude").

    `side` is None where the bench already computed exactly this run.
    """

    side: Side | None
    fn: Any
    autocast: torch.dtype | None
    device: Device
    label: str
    role: str = "torch"

    sampled: Sampled | None = None  # the rows a sampled torch run computed (sampled_torch_run)

    def cotangent(self, value: Any) -> Any:
        """The recorded gradient as this run backpropagates it (its absolute value for the magnitude run)."""
        return value.abs() if self.role == "magnitude" and isinstance(value, torch.Tensor) else value

    def complete(self, grads: list[Any], bench: list[Any],
                 positions: list[int]) -> tuple[list[Any], list[torch.Tensor | None]]:
        """Gradients the run computed on sampled rows only, completed, with the masks of the estimated
        elements: each other row is the bench's plus the run's error at the same place of a sampled row,
        rounded to the run's dtype."""
        done = [_borrow(g, b, (self.sampled or {}).get(pos)) for g, b, pos in zip(grads, bench, positions)]
        return [g for g, _ in done], [m for _, m in done]


Sampled = dict[int, tuple[torch.Tensor, int]]  # tensor argument's position -> (rows computed, rows in all)


class RunInputs(NamedTuple):
    """A call's inputs as an extra run of it (third_run, summed_run, terms.terms_run) takes them: its arguments,
    the ids of the tensors that take a gradient and whether gradients are wanted (a backward item), the CPU
    tensors a side on the CPU may take without a copy (None: fresh copies), and the bench's device, where the
    run goes (msprobe_bench_device)."""
    args: list[Any]
    kwargs: dict[str, Any]
    requires_grad: set[int]
    want_grad: bool
    shared: Shared | None = None
    on: str = "cpu"


def third_run(options: CheckOptions, resolved: Any, name: Any, specs: dict[str, Any], plan: Any,
              inputs: RunInputs) -> ReferenceRun | None:
    """The third run the chosen standard compares against, or None.

    With --msprobe-reference the API runs on that device in the recorded dtype (three-way check).
    Otherwise `strict` learns what a correct kernel may lose: from torch's own kernel on CPU in the
    recorded dtype, or, for contractions (whose 16-bit CPU kernels are too slow to run), from the
    size of their terms: the API on CPU on the absolute values of its inputs, in fp32 (fp64 for fp64). `on`: the
    device of these runs (msprobe_bench_device; the torch run's sampled kernels stay on the CPU).
    """
    args, kwargs, requires_grad, want_grad, shared, on = inputs
    if options.reference_device:
        ref_device = select_device(options.reference_device)
        ref = resolve(name.api_type, name.api_name, ref_device, specs, getattr(resolved, "call", None))
        side = make_side(args, kwargs, target=Target(ref_device.name, lambda t: t.dtype, False),
                         requires_grad=requires_grad, want_grad=want_grad)
        return ReferenceRun(side, ref.device_fn, plan.autocast, ref_device, f"{ref.label} on {ref_device.name}")
    if options.standard != "strict":
        return None
    low = (torch.float16, torch.bfloat16)
    sixteen = plan.autocast in low or all(t.dtype in low for t in args[:2] if isinstance(t, torch.Tensor))
    # only torch's 16-bit kernels are slow enough to sample: an fp32 one costs less than its fp64 bench
    sample = float(specs["error_model"].get("torch_run_sample", 1.0)) if want_grad and sixteen and in_list(
        specs, name.api_name, "error_model", "sampled_torch_run") else 1.0
    sampled: Sampled = {}
    if want_grad and in_list(specs, name.api_name, "error_model", "torch_backward") and sixteen:
        side = make_side(args, kwargs, target=Target("cpu", lambda t: plan.autocast if plan.autocast in low and
                                                     t.is_floating_point() else t.dtype, True, shared=shared),
                         requires_grad=requires_grad, want_grad=want_grad)
        return ReferenceRun(side, lambda *a, **k: _conv_torch_backward(sampled, sample, *a, **k), None,
                            Device("cpu"), "torch's conv backward kernel on cpu, device dtype"
                            + (", on sampled rows" if sample < 1 else ""), sampled=sampled)
    if error_kind(name.api_name, specs) == "contraction":
        return _magnitude(resolved, specs, (args, kwargs), (requires_grad, want_grad), shared, on)
    if on != "cpu" and sample == 1 and name.api_type != "NPU":
        side = make_side(args, kwargs, target=Target(on, lambda t: t.dtype, False), requires_grad=requires_grad,
                         want_grad=want_grad)
        return ReferenceRun(side, resolved.bench_fn, plan.autocast, device_named(on), f"torch's kernel on {on}, device dtype")
    side = make_side(args, kwargs, target=Target("cpu", lambda t: t.dtype, True, shared=shared),
                     requires_grad=requires_grad, want_grad=want_grad)
    if sample < 1 and name.api_name == "scaled_dot_product_attention":
        return ReferenceRun(side, lambda *a, **k: sampled_attention(resolved.bench_fn, sampled, sample, *a, **k),
                            plan.autocast, Device("cpu"), "torch's kernel on cpu, device dtype, on sampled heads",
                            sampled=sampled)
    if name.api_type == "NPU":
        fn, label = _npu_reference(name.api_name, resolved.bench_fn)
        return ReferenceRun(side, fn, plan.autocast, Device("cpu"), label)
    return ReferenceRun(side, resolved.bench_fn, plan.autocast, Device("cpu"), "torch's kernel on cpu, device dtype")


@dataclass
class Summed:
    """The magnitude run of an item whose outputs (or some gradients) are sums whose order a kernel chooses, or fused
    multiply-adds: each element of its outputs is the size of the terms that made the bench's (api_specs
    error_model.yaml `sums`, `fused_multiply_add`). `rules`: the strict thresholds' section that scales it;
    `positions`: for a backward item, the inputs whose gradients are such sums."""

    run: ReferenceRun
    rules: str
    positions: frozenset[int] = frozenset()
    sizes: Any = None  # a named kernel scheme's sizes of the summed gradient, in place of the run's (schemes.py)

    def sized(self, grad: Any) -> Any:
        """A summed gradient as the size its comparison reads: the scheme's where it names one."""
        return grad if self.sizes is None or grad is None else self.sizes.to(grad.device)


def summed_run(options: CheckOptions, resolved: Any, api: str, specs: dict[str, Any], inputs: RunInputs,
               out_shape: tuple[int, ...] | None) -> Summed | None:
    """The magnitude run of a call that sums (strict only; contractions have theirs as the third run): a forward
    item of an API listed under `sums` or `fused_multiply_add` (or an add with alpha); a backward item some of whose
    gradients sum over a broadcast (the input broadcast to the output, as a mul's bias or a norm's weight) or over
    the API's indices (`sums_backward`: embedding, gather). Any order of adding n terms loses at most about
    n * u * their sizes, and a fused multiply-add differs from two roundings by u * the product's size: both are
    relative to the terms, not to a result they cancel to."""
    args, kwargs, requires_grad, want_grad, shared, on = inputs
    if options.standard != "strict" or options.reference_device or error_kind(api, specs) == "contraction":
        return None
    if not want_grad:
        rules = forward_sums(api, specs, kwargs)
        if rules is None:
            return None
        sizes = term_size_fn(api, specs)
        if sizes is not None:
            return Summed(_term_sizes(sizes, (args, kwargs), shared, on), rules)
        return Summed(_magnitude(resolved, specs, (args, kwargs), (set(requires_grad), False), shared, on), rules)
    positions = summed_gradients(api, args, kwargs, requires_grad, out_shape, specs)
    if not positions:
        return None
    return Summed(_magnitude(resolved, specs, (args, kwargs), (requires_grad, True), shared, on), "sums", positions)


def forward_sums(api: str, specs: dict[str, Any], kwargs: dict[str, Any]) -> str | None:
    """The strict thresholds' section that judges a forward item's outputs against the size of their terms: `sums`
    (any order of adding), `fused_multiply_add` (one rounding fewer; an add with alpha too), or None."""
    if in_list(specs, api, "error_model", "sums"):
        return "sums"
    if in_list(specs, api, "error_model", "fused_multiply_add") or (
            in_list(specs, api, "error_model", "alpha_multiply_add") and kwargs.get("alpha", 1) != 1):
        return "fused_multiply_add"
    return None


def summed_gradients(api: str, args: list[Any], kwargs: dict[str, Any], requires_grad: set[int],
                     out_shape: tuple[int, ...] | None, specs: dict[str, Any]) -> frozenset[int]:
    """Positions (as make_side counts tensor arguments) of the gradients that are sums: every one of an API under
    `sums_backward`, else those of float inputs broadcast to the output, whose shape is the broadcast of the float
    inputs' (so a concatenation's slices are not sums)."""
    tensors: list[torch.Tensor] = []
    map_structure(lambda v: tensors.append(v) if isinstance(v, torch.Tensor) else None, [args, kwargs])
    grads = {i for i, t in enumerate(tensors) if id(t) in requires_grad and t.is_floating_point()}
    if in_list(specs, api, "error_model", "sums_backward"):
        return frozenset(grads)
    floats = [t for t in tensors if t.is_floating_point()]
    try:
        full = tuple(torch.broadcast_shapes(*(t.shape for t in floats))) if floats else None  # type: ignore[no-untyped-call]
    except RuntimeError:
        return frozenset()
    if full is None or out_shape is None or full != tuple(out_shape):
        return frozenset()
    return frozenset(i for i in grads if tuple(tensors[i].shape) != full)


def summed_outputs(summed: Summed | None, leaves: list[Any] | None, gradients: bool) -> tuple[list[Any], str] | None:
    """The magnitude run's outputs that bound sums (a backward item's: its gradients of summed inputs, None for the
    others), in the order compare_outputs pairs them, with the thresholds' section that scales them."""
    if summed is None or leaves is None or summed.run.side is None:
        return None
    if not gradients:
        return leaves, summed.rules
    return [summed.sized(leaf.grad) if pos in summed.positions else None
            for pos, leaf in summed.run.side.grad_leaves], summed.rules


def _magnitude(resolved: Any, specs: dict[str, Any], call: tuple[list[Any], dict[str, Any]],
               grads: tuple[set[int], bool], shared: Shared | None, on: str = "cpu") -> ReferenceRun:
    """The API on the absolute values of its inputs (`call`: args, kwargs) and of its scalar factors, in fp32 (fp64
    for fp64): each result is the sum of its terms' sizes, which bounds what any order of summing them loses.
    `grads`: the ids of the inputs that require a gradient, and whether one is wanted."""
    args, kwargs = call
    requires_grad, want_grad = grads
    scalars = set(specs["error_model"].get("contraction_scalars", ()))

    owned: set[int] = set()  # the |inputs| made here: the side takes them without a copy where no cast is needed

    def absolute(v: Any) -> Any:
        if isinstance(v, torch.Tensor) and v.is_floating_point():
            moved = torch.abs(v, out=cpu_empty_like(v, v.dtype)) if v.device.type == "cpu" and not v.requires_grad \
                else v.abs()
            owned.add(id(moved))
            if id(v) in requires_grad:
                requires_grad.add(id(moved))
            return moved
        return v

    abs_args = [map_structure(absolute, a) for a in args]
    abs_kwargs = {k: (abs(v) if k in scalars and isinstance(v, (int, float)) else map_structure(absolute, v))
                  for k, v in kwargs.items()}
    side = make_side(abs_args, abs_kwargs, target=Target(on, _wide, on == "cpu", owned=owned if on == "cpu" else (),
                                                         shared=shared if on == "cpu" else None),
                     requires_grad=requires_grad, want_grad=want_grad)
    where = "" if on == "cpu" else f" on {on}"
    return ReferenceRun(side, resolved.bench_fn, None, device_named(on), f"magnitude: the API on |inputs| in fp32{where}",
                        "magnitude")


def _term_sizes(fn: Any, call: tuple[list[Any], dict[str, Any]], shared: Shared | None, on: str) -> ReferenceRun:
    """The magnitude run of a forward sum with a subtraction inside (error_model.yaml `term_sizes`): its term-size
    function on the call's own arguments, in fp32 (fp64 for fp64)."""
    args, kwargs = call
    side = make_side(args, kwargs, target=Target(on, _wide, on == "cpu", shared=shared if on == "cpu" else None),
                     requires_grad=set(), want_grad=False)
    where = "" if on == "cpu" else f" on {on}"
    return ReferenceRun(side, fn, None, device_named(on), f"magnitude: the size of its terms in fp32{where}",
                        "magnitude")


def _wide(t: torch.Tensor) -> torch.dtype:
    """fp32 for a float tensor below it, fp64 kept, others as they are: the dtype of the magnitude runs."""
    return t.dtype if t.dtype == torch.float64 or not t.is_floating_point() else torch.float32


def device_named(on: str) -> Device:
    """A plain torch device from its name (`cpu`, `cuda:0`)."""
    kind, _, index = on.partition(":")
    return Device(kind, int(index) if index else None)


def _npu_reference(api: str, bench_fn: Any) -> tuple[Any, str]:
    """A fused NPU op's third run: its reference with the intermediate roundings a sound kernel in the
    device dtype makes (api_specs/bench_functions.yaml `rounded`), or the reference itself."""
    import bench_functions

    rounded = bench_functions.get_rounded(api)
    if rounded is None:
        return bench_fn, "the reference on cpu, device dtype"
    return rounded, "the reference with a sound kernel's roundings (bench_functions.yaml `rounded`), device dtype"


def bench_product(api: str, side: Side, leaves: list[Any], specs: dict[str, Any]) -> Any:
    """A contraction's bench result without its additive argument (api_specs error_model.contraction_bias),
    or None: the product a sound kernel may round before adding the bias."""
    rule = specs["error_model"].get("contraction_bias", {}).get(api)
    if not rule or not leaves or not isinstance(leaves[0], torch.Tensor):
        return None
    position = rule["position"]
    bias = side.kwargs.get(rule["name"], side.args[position] if len(side.args) > position else None)
    if not isinstance(bias, torch.Tensor):
        return None
    out = leaves[0].detach()
    bias = bias.detach().to(out.dtype) * side.kwargs.get(rule.get("scale", ""), 1)
    if rule["broadcast"] == "channel" and len(side.args) > 1 and isinstance(side.args[1], torch.Tensor):
        bias = bias.reshape(-1, *[1] * (side.args[1].dim() - 2))  # the weight's spatial dimensions
    try:
        return out - bias
    except RuntimeError:  # shapes that do not broadcast: no allowance
        return None


def autocast_round(v: Any, dtype: torch.dtype, requires_grad: set[int]) -> Any:
    """A float tensor wider than the autocast dtype, rounded to it (kept in its own dtype)."""
    if not isinstance(v, torch.Tensor) or v.dtype not in (torch.float32, torch.float64):
        return v
    rounded = v.detach().to(dtype).to(v.dtype)
    if id(v) in requires_grad:
        requires_grad.add(id(rounded))
    return rounded


def sample_rows(n: int, fraction: float) -> torch.Tensor:
    """About `fraction` of n row indices, evenly spaced, the first and the last included."""
    k = min(n, max(2, -int(-n * fraction // 1)))
    rows: torch.Tensor = torch.unique(torch.linspace(0, n - 1, k).round().long())
    return rows


def _borrow(grad: Any, bench: Any, rows: tuple[torch.Tensor, int] | None) -> tuple[Any, torch.Tensor | None]:
    if rows is None or not isinstance(grad, torch.Tensor) or not isinstance(bench, torch.Tensor) \
            or grad.shape != bench.shape or rows[0].numel() == rows[1]:
        return grad, None
    computed, total = rows
    source = computed[torch.arange(total) % computed.numel()]
    source[computed] = computed
    b = bench.detach().to(torch.float32 if bench.dtype != torch.float64 else bench.dtype).reshape(total, -1)
    g = grad.detach().reshape(total, -1)
    estimate = b + (g.to(b.dtype) - b)[source]
    estimate = torch.where(torch.isfinite(estimate) | ~torch.isfinite(b), estimate, b)
    completed = estimate.to(grad.dtype)
    completed[computed] = g[computed]
    estimated = torch.ones(total, dtype=torch.bool)
    estimated[computed] = False
    return completed.reshape(grad.shape), estimated[:, None].expand(total, g.shape[1]).reshape(grad.shape)


def _positions(args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[int, int]:
    """id of each tensor argument -> its position among them (as make_side counts gradient leaves)."""
    tensors = [v for v in (*args, *kwargs.values()) if isinstance(v, torch.Tensor)]
    return {id(t): i for i, t in enumerate(tensors)}


_ATTENTION_PARAMS = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale", "enable_gqa")


def sampled_attention(fn: Any, sampled: Sampled, fraction: float, *args: Any, **kwargs: Any) -> Any:
    """Attention (scaled_dot_product_attention's signature) on sampled (batch, head) pairs, zero elsewhere;
    the whole call where the pairs do not split (grouped heads, a mask per head, dropout)."""
    bound = dict(zip(_ATTENTION_PARAMS, args), **kwargs)
    qkv, mask = [bound.get(p) for p in ("query", "key", "value")], bound.get("attn_mask")
    tensors = [t for t in qkv if isinstance(t, torch.Tensor) and t.dim() == 4]
    if len(tensors) < 3 or bound.get("enable_gqa") or bound.get("dropout_p") or \
            len({t.shape[:2] for t in tensors}) > 1 or \
            (isinstance(mask, torch.Tensor) and mask.dim() > 2 and any(d != 1 for d in mask.shape[:-2])):
        return fn(*args, **kwargs)
    position = _positions(args, kwargs)
    batch, heads = tensors[0].shape[:2]
    rows = sample_rows(batch * heads, fraction)
    for t in tensors:
        sampled[position[id(t)]] = (rows, batch * heads)
    # kept 4-D, the shape torch's fused kernels take (3-D inputs take another path)
    q, k, v = (t.reshape(batch * heads, *t.shape[2:])[rows][None] for t in tensors)
    out = fn(q, k, v, **{p: x for p, x in bound.items() if p not in ("query", "key", "value")})[0]
    return _scatter(out, rows, batch * heads).reshape(batch, heads, *out.shape[1:])


def _scatter(part: torch.Tensor, rows: torch.Tensor, total: int) -> torch.Tensor:
    """`part` placed at `rows` of `total` rows, zero elsewhere (what a sampled run did not compute)."""
    return part.new_zeros(total, *part.shape[1:]).index_copy(0, rows, part)


_CONV_PARAMS = ("input", "weight", "bias", "stride", "padding", "dilation", "groups")


class _Conv(NamedTuple):
    """_ConvTorchBackward's arguments beside its tensors (which stay positional, so that autograd sees them):
    the convolution's stride, padding, dilation and groups, and its sampling: where the rows go (`sampled`),
    the fraction of rows, and the tensors' argument positions (input, weight, bias)."""
    stride: list[int]
    padding: list[int]
    dilation: list[int]
    groups: int
    sampled: Sampled
    fraction: float
    positions: list[int]


class _ConvTorchBackward(torch.autograd.Function):
    """A 16-bit convolution for backward items: no forward values (torch's 16-bit CPU forward is tens of
    times slower, and a backward item compares gradients only) and torch's own 16-bit backward kernel,
    which rounds its partial sums, on sampled rows: the input's gradient for some samples, the weight's
    and bias's for some output channels (all of them where groups > 1). `sampled` gets the rows, by
    argument position.

    For a 2-d convolution without groups or dilation the kernel is torch's native one (`_slow_conv2d_backward`,
    what torch runs without oneDNN), never oneDNN's: oneDNN picks its 16-bit convolution by the host's ISA, and
    with AVX512-BF16 or AMX it accumulates a whole gradient in fp32 and rounds once. That made the reference of a
    sound 16-bit kernel a perfect one on such hosts, and the same tree flagged an im2col convolution's gradients
    there and not on an AVX2 host (tests/test_host_paths.py). Grouped, dilated, 1-d and 3-d convolutions keep
    torch's dispatch, and with it the host's kernel. The global switch (torch.backends.mkldnn) is not used: the
    device's run may be in another thread meanwhile."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None, conv: _Conv) -> torch.Tensor:
        stride, padding, dilation, groups, sampled, fraction, positions = conv
        ctx.save_for_backward(x, w)
        ctx.params = (b is not None, stride, padding, dilation, groups)
        ctx.sampled, ctx.fraction, ctx.positions = sampled, fraction, positions
        # only the gradients are compared: the forward's values are never used, just its shape
        spatial = [(size + 2 * p - d * (k - 1) - 1) // s + 1
                   for size, k, s, p, d in zip(x.shape[2:], w.shape[2:], stride, padding, dilation)]
        return x.new_zeros(x.shape[0], w.shape[0], *spatial)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> Any:
        x, w = ctx.saved_tensors
        has_bias, stride, padding, dilation, groups = ctx.params
        grad = grad.to(x.dtype)
        samples = sample_rows(x.shape[0], ctx.fraction)
        channels = sample_rows(w.shape[0], ctx.fraction if groups == 1 else 1.0)

        native = x.dim() == 4 and groups == 1 and all(d == 1 for d in dilation)  # torch's own kernel covers it

        def run(rows_x: torch.Tensor, rows_w: torch.Tensor, mask: list[bool]) -> Any:
            if native:  # the same kernel on every host (see the docstring)
                return torch.ops.aten._slow_conv2d_backward.output_mask(
                    grad[rows_x][:, rows_w], x[rows_x], w[rows_w], list(w.shape[2:]), stride, padding, mask)
            return torch.ops.aten.convolution_backward(
                grad[rows_x][:, rows_w], x[rows_x], w[rows_w], [rows_w.numel()] if has_bias else None, stride,
                padding, dilation, False, [0] * len(stride), groups, mask)

        gx = _scatter(run(samples, torch.arange(w.shape[0]), [True, False, False])[0], samples, x.shape[0])
        _, gw_rows, gb_rows = run(torch.arange(x.shape[0]), channels, [False, True, has_bias])
        gw = _scatter(gw_rows, channels, w.shape[0])
        gb = _scatter(gb_rows, channels, w.shape[0]) if has_bias else None
        ctx.sampled.update({ctx.positions[0]: (samples, x.shape[0]), ctx.positions[1]: (channels, w.shape[0])})
        if has_bias:
            ctx.sampled[ctx.positions[2]] = (channels, w.shape[0])
        return gx, gw, gb, None


def _conv_torch_backward(sampled: Sampled, fraction: float, *args: Any,
                         **kwargs: Any) -> torch.Tensor:
    """F.conv{1,2,3}d's signature over _ConvTorchBackward (a string padding falls back to plain conv)."""
    bound = dict(zip(_CONV_PARAMS, args), **kwargs)
    x, w = bound["input"], bound["weight"]
    spatial = w.dim() - 2

    def expand(value: Any, default: int) -> list[int]:
        value = default if value is None else value
        return [int(value)] * spatial if isinstance(value, int) else [int(v) for v in value]

    if isinstance(bound.get("padding"), str) or x.dim() != w.dim():  # unbatched or "same": torch's own
        return cast(torch.Tensor, getattr(torch.nn.functional, f"conv{spatial}d")(*args, **kwargs))
    out: torch.Tensor = _ConvTorchBackward.apply(  # type: ignore[no-untyped-call]  # Function.apply: unannotated
        x, w, bound.get("bias"), _Conv(expand(bound.get("stride"), 1), expand(bound.get("padding"), 0),
                                       expand(bound.get("dilation"), 1), int(bound.get("groups") or 1), sampled,
                                       fraction, [_positions(args, kwargs).get(id(t), -1) for t in (x, w, bound.get("bias"))]))
    return out
