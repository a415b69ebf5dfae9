"""A small training loop checked as it runs: a bf16 MLP, its backward and an AdamW step, twice.

    python examples/in_training/train.py            # torch's own kernels: every call passes
    python examples/in_training/train.py --bug      # a softmax kernel that normalises in bf16: it fails

Each API call inside the block is checked in two worker processes beside the loop; at the end the files are
in msprobe_inprocess/ and one line says what was checked. A failing call raises CheckFailed, and its call is
kept as a tensor dump that `pytest msprobe_inprocess/dump --msprobe-mode replay` checks again.
"""
import sys

import torch

import pytest_msprobe


def softmax_in_bf16(x: torch.Tensor, dim: int = -1, **_: object) -> torch.Tensor:
    """The planted bug: the normaliser summed and divided in bf16."""
    e = (x - x.amax(dim, keepdim=True)).exp()
    return e / e.sum(dim, keepdim=True)


def main() -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.GELU(), torch.nn.Linear(512, 32))
    model = model.to(torch.bfloat16)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x, target = torch.randn(64, 256, dtype=torch.bfloat16), torch.randint(32, (64,))
    if "--bug" in sys.argv:  # the device's softmax kernel, replaced below every mode: the bench never runs it
        lib = torch.library.Library("aten", "IMPL")
        lib.impl("_softmax", lambda t, dim, half: softmax_in_bf16(t, dim), "CPU")
    with pytest_msprobe.checking(out="msprobe_inprocess", workers=2) as checker:
        for _ in range(2):
            probs = torch.nn.functional.softmax(model(x), dim=-1)
            loss = torch.nn.functional.nll_loss(probs.float().log(), target)
            loss.backward()
            opt.step()
            opt.zero_grad()
            checker.step()
    print(f"loss {loss.item():.4f}")


if __name__ == "__main__":
    main()
