"""A device's accuracy contract: what a correct kernel of its vendor may lose beyond torch's own CPU kernel.

`strict` learns what a sound kernel loses from the torch run (torch's CPU kernel in the device dtype). A vendor's
elementwise functions may be less accurate and still correct by its documentation: CUDA's sinf is within 2 ULP of
the exact value, torch's CPU sin within about 1. The contract (api_specs/contracts.yaml) names, per function and
dtype, the bound a vendor documents and the mean bias it may have; `raised` lifts strict's gross, mean and bias
limits to them, never lowers them. Pure: no torch, no pytest.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def resolve(option: str, device_kind: str) -> str:
    """The contract a run is judged by: the option's, or with `auto` the vendor of the device that computed the
    device's outputs (cuda, npu), torch's own kernels elsewhere."""
    if option != "auto":
        return option
    return device_kind if device_kind in ("cuda", "npu") else "torch"


def bound(specs: Mapping[str, Any], contract: str, api: str, dtype: str, gradients: bool) -> tuple[float, float] | None:
    """(ULP bound, bias in ULPs) of `api`'s outputs (its gradients, for a backward item) in `dtype` under the
    contract, or None where the contract lists nothing for them."""
    table = specs.get("contracts", {}).get(contract)
    if not table:
        return None
    entry = (table.get("backward", {}).get(api) if gradients else None) or table.get("functions", {}).get(api)
    if not entry or dtype not in entry:
        return None
    return float(entry[dtype]), float(table.get("bias", 0.0))


def cancels(specs: Mapping[str, Any], contract: str, api: str, gradients: bool) -> bool:
    """Whether the contract bounds `api`'s outputs (its gradients, for a backward item) relative to the terms of a
    sum they cancel in (contracts.yaml `terms`; runs/terms.py), not to the result."""
    table = specs.get("contracts", {}).get(contract) or {}
    return ("backward" if gradients else "forward") in (table.get("terms", {}).get(api) or ())


def raised(rules: Mapping[str, Any], allowance: tuple[float, float] | None) -> Mapping[str, Any]:
    """strict's flattened rules with the limits a contract's bound allows, each the larger of the two."""
    if allowance is None:
        return rules
    ulp, bias = allowance
    # within `ulp` ULPs of the exact value is within ulp + 1/2 of the correctly rounded one; errors spread evenly
    # within the bound average half of it (api_specs/contracts.yaml's header)
    limits = {"gross": ulp + 1.0, "mean_slack": ulp / 2.0, "bias_min_ulp": bias}
    return {**rules, **{k: max(float(rules.get(k, 0.0)), v) for k, v in limits.items()}}
