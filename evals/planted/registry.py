"""Every planted arm by name: the CPU-style bugs and variants of `arms.py` and the accelerator-like kernels of
`accelerator/`. `--arms` and the plugin look arms up here; a default run measures `arms.ARMS` alone."""
from __future__ import annotations

from evals.planted.accelerator import ACCELERATOR_ARMS
from evals.planted.arm import Arm
from evals.planted.arms import ARMS

BY_NAME: dict[str, Arm] = {arm.name: arm for arm in [*ARMS, *ACCELERATOR_ARMS]}
