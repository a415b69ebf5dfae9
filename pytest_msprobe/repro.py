"""`--msprobe-repro DIR`: one standalone Python script per failing item (REFERENCE §9.3, op_generate).

The script is a template: a JSON `SPEC` (the call, the precision plan, the thresholds and the numbers
the item reported), the inputs, and `repro_runtime.py` copied verbatim (torch only; torch_npu on an
NPU host, `bench_functions` for `NPU.*` ops). It never imports pytest_msprobe.

* Inputs are the tensors both sides got (after msprobe's dtype fixes and HF32 rounding). Up to
  `EMBED_LIMIT` bytes they are embedded (a base64 `torch.save` blob); larger ones go to
  `<script>.pt` beside the script, loaded with `weights_only=True`.
* "The same numbers" means, per compared output: cosine, max abs error, 双百/双千/双万, the binary
  error rate, the worst element (index, device and bench values, errors), the Layer-1 status, and
  under `strict` every statistic strict judged by (max/mean error in ULPs, the reference's, the noise
  floor, the bias z-scores and sizes) and its verdict; plus the item's status. The script prints
  them, compares them with the item's record (embedded) and says whether they are the same. The
  Layer-2 verdicts of msprobe's new standard other than binary consistency are shown as recorded.

The worker that ran the item writes its script (unique name per item), so nothing is shared.
"""
from __future__ import annotations

import base64
import io
import json
import math
import re
from pathlib import Path
from typing import Any, Mapping

EMBED_LIMIT = 256 * 1024  # bytes of tensor data embedded in the script; the rest goes to <script>.pt
RUNTIME = Path(__file__).with_name("repro_runtime.py")


def script_name(nodeid: str) -> str:
    """A file name per item: the dump folder and the entry, e.g. `step0_rank0__Functional.gelu.0.forward.py`."""
    path, _, entry = nodeid.rpartition("::")
    folder = Path(path).parent.as_posix().strip("./")
    stem = f"{folder}__{entry}" if folder else entry
    return re.sub(r"[^A-Za-z0-9_.\-]+", "_", stem).strip("_") + ".py"


class _Encoder:
    def __init__(self) -> None:
        self.tensors: dict[str, Any] = {}
        self.ids: dict[int, str] = {}

    def tensor(self, t: Any) -> str:
        key = self.ids.get(id(t))
        if key is None:
            key = self.ids[id(t)] = f"t{len(self.ids)}"
            self.tensors[key] = t.detach().cpu().clone()
        return key

    def value(self, v: Any) -> Any:
        import torch

        from .inputs import DeviceArg

        if isinstance(v, torch.Tensor):
            return {"__tensor__": self.tensor(v)}
        if isinstance(v, torch.Size):
            return {"__size__": list(v)}
        if isinstance(v, list):
            return [self.value(x) for x in v]
        if isinstance(v, tuple):
            return {"__tuple__": [self.value(x) for x in v]}
        if isinstance(v, dict):
            return {"__dict__": {str(k): self.value(x) for k, x in v.items()}}
        if isinstance(v, float) and not math.isfinite(v):
            return {"__float__": repr(v)}
        if v is None or isinstance(v, (bool, int, float, str)):
            return v
        if isinstance(v, slice):
            return {"__slice__": [v.start, v.stop, v.step]}
        if v is Ellipsis:
            return {"__ellipsis__": True}
        if isinstance(v, torch.dtype):
            return {"__dtype__": str(v).split(".")[1]}
        if isinstance(v, torch.memory_format):
            return {"__memory_format__": str(v).split(".")[1]}
        if isinstance(v, DeviceArg):
            return {"__device__": v.recorded}
        if type(v).__module__ == "numpy" and hasattr(v, "dtype") and hasattr(v, "shape"):
            return {"__ndarray__": self.tensor(torch.from_numpy(v))}
        if hasattr(v, "item") and type(v).__module__ == "numpy":  # numpy scalar
            return v.item()
        raise TypeError(f"cannot write a {type(v).__name__} argument into a repro script")


def build_spec(captured: Mapping[str, Any], record: Mapping[str, Any], options: Any,
               specs: Mapping[str, Any], nodeid: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """(SPEC, tensors) of one item from what its check stashed."""
    from .specs import api_settings, thresholds_for

    name = captured["name"]
    enc = _Encoder()
    args = enc.value(list(captured["args"]))
    kwargs = {str(k): enc.value(v) for k, v in captured["kwargs"].items()}
    cotangents = enc.value(list(captured.get("cotangents") or []))
    requires_grad = [key for obj_id, key in enc.ids.items() if obj_id in (captured.get("requires_grad") or ())]
    plan = captured["plan"]
    api = name.api_name
    user = api_settings(specs, api)
    th = thresholds_for(specs, api)
    spec = {
        "item": nodeid, "api": name.full_name, "api_type": name.api_type, "api_name": api,
        "direction": name.direction, "bench_name": specs.get("aliases", {}).get(api, api),
        "function": getattr(captured.get("resolved"), "api_path", None),  # Torch.inv: torch.linalg.inv
        "device": captured["device"].name, "seed": record["seed"], "standard": options.standard,
        "plan": {"raise_to": None if plan.raise_to is None else str(plan.raise_to),
                 "autocast": None if plan.autocast is None else str(plan.autocast), "hf32": bool(plan.hf32)},
        "args": args, "kwargs": kwargs, "cotangents": cotangents, "requires_grad": requires_grad,
        "grad_index": user.get("grad_index", specs.get("backward", {}).get("grad_index", {}).get(api)),
        "selected_outputs": specs.get("forward_output_index", {}).get(api),
        "npu_postprocess": name.api_type == "NPU", "dropout": api in specs.get("dropout_apis", []),
        "reference_device": options.reference_device, "perturbed_runs": _perturbed_runs(),
        "kernels": getattr(options, "kernels", None) if record.get("kernel") else None,  # --msprobe-kernels
        "thresholds": {"layer1": th["layer1"], "rel_err_eps": th["rel_err_eps"], "strict": th["strict"],
                       "dropout": th["dropout"], "thousandth_verdict": th["thousandth_verdict"]},
        "expected": {"status": record.get("status"), "message": str(record.get("message") or "")[:2000],
                     "outputs": [_expected(o) for o in record.get("outputs") or ()]},
    }
    return spec, enc.tensors


def _perturbed_runs() -> int:
    from .check import PERTURBED_RUNS

    return PERTURBED_RUNS


def _expected(out: Mapping[str, Any]) -> dict[str, Any]:
    keep = ("name", "status", "verdict", "algorithm", "device_dtype", "bench_dtype", "shape", "metrics", "worst",
            "reference", "compare")
    return {k: out.get(k) for k in keep}


def render(spec: Mapping[str, Any], tensors: Mapping[str, Any], script: Path) -> str:
    """The script's text; tensors beyond EMBED_LIMIT are written to `<script>.pt` beside it."""
    import torch

    small, large = {}, {}
    budget = EMBED_LIMIT
    for key, t in tensors.items():
        size = t.numel() * t.element_size()
        if size <= budget:
            small[key], budget = t, budget - size
        else:
            large[key] = t
    blob = ""
    if small:
        buffer = io.BytesIO()
        torch.save(small, buffer)
        blob = base64.b64encode(buffer.getvalue()).decode("ascii")
    tensors_file = None
    if large:
        tensors_file = script.with_suffix(".pt").name
        torch.save(large, script.with_suffix(".pt"))
    spec_json = json.dumps(spec, indent=1, allow_nan=True, ensure_ascii=False)
    if "'''" in spec_json:
        spec_literal = f"json.loads(base64.b64decode({base64.b64encode(spec_json.encode()).decode()!r}))"
    else:
        spec_literal = f"json.loads(r'''{spec_json}''')"
    blob_lines = "\n".join(f"    {blob[i:i + 100]!r}" for i in range(0, len(blob), 100)) or "    ''"
    expected = spec["expected"]
    header = f'''#!/usr/bin/env python3
"""Standalone reproducer of {spec["api"]}.{spec["direction"]}, written by pytest-msprobe --msprobe-repro.

Item:     {spec["item"]}
Reported: {expected["status"]} under the `{spec["standard"]}` standard (seed {spec["seed"]}, device {spec["device"]})

Run:  python {script.name}               # prints the metrics and the verdict; exit status 1 on error
      python {script.name} --device cpu  # another device under test
      python {script.name} --json        # the numbers as one JSON object
Needs only torch (torch_npu on an NPU host; bench_functions for NPU.* ops), not pytest-msprobe.
Edit SPEC or the runtime below to experiment with the call.
"""
import base64
import json

SPEC = {spec_literal}

TENSOR_BLOB = (
{blob_lines}
)
TENSORS_FILE = {tensors_file!r}  # larger inputs, beside this script
'''
    footer = '''

if __name__ == "__main__":
    sys.exit(main(SPEC, load_tensors("".join(TENSOR_BLOB), TENSORS_FILE, os.path.dirname(os.path.abspath(__file__)))))
'''
    return header + "\n" + RUNTIME.read_text(encoding="utf-8") + footer


def write_script(folder: Path, captured: Mapping[str, Any], record: Mapping[str, Any], options: Any,
                 specs: Mapping[str, Any], nodeid: str, name: str | None = None) -> Path | None:
    """Write the repro of one item; None when the check failed before its inputs existed."""
    if "args" not in captured or "plan" not in captured:
        return None
    folder.mkdir(parents=True, exist_ok=True)
    script = folder / (name or script_name(nodeid))
    spec, tensors = build_spec(captured, record, options, specs, nodeid)
    text = render(spec, tensors, script)
    tmp = script.with_name(f".{script.name}.tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(script)
    return script
