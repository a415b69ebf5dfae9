"""The recorded-replay evaluation's model trains one step on CPU and its skip reasons group across items."""
from __future__ import annotations

import xml.etree.ElementTree as ET

import torch

from evals.recorded_replay import build_moe, skip_reason


def test_moe_step_runs_and_the_relu_router_ties() -> None:
    torch.manual_seed(0)
    model, loss_fn = build_moe(torch.bfloat16)
    seen: list[torch.Tensor] = []
    model.blocks[0].moe.router.register_forward_hook(lambda m, i, o: seen.append(torch.relu(o)))
    loss = loss_fn()
    loss.backward()
    assert torch.isfinite(loss)
    assert all(p.grad is not None for p in model.parameters())
    probs = seen[0]
    second = probs.topk(2, -1).values[:, 1:]
    assert ((probs == second).sum(-1) > 1).any(), "no row of the ReLU router has a tie at the top-2 boundary"


def test_skip_reason_drops_the_item_and_numbers() -> None:
    a = ET.fromstring('<skipped message="Functional.linear.3.backward: recorded shape [1, 32, 64] vs 2 inputs"/>')
    b = ET.fromstring('<skipped message="Functional.linear.9.backward: recorded shape [1, 32, 192] vs 2 inputs"/>')
    assert skip_reason(a) == skip_reason(b) == "recorded shape [..] vs N inputs"
