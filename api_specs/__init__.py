"""Data package: the YAML files beside this module hold every threshold, list and alias."""
from __future__ import annotations

from pathlib import Path

SPEC_DIR = Path(__file__).resolve().parent
