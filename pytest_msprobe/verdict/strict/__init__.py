"""The `strict` standard (the default): what a correct kernel in the device dtype may lose, per kind of op.

rules.py holds the rules once (the quantities, the limits, the decision; its docstring is the standard's
description); backends.py lists the passes that compute the quantities (numpy, numba, torch on the device,
streamed) behind one interface; compare.py is the entry, `strict_compare`.
"""
from __future__ import annotations

from ..grid import round_to
from .compare import Runs, strict_compare
from .rules import KINDS, StrictResult, size_of

__all__ = ["KINDS", "Runs", "StrictResult", "round_to", "size_of", "strict_compare"]
