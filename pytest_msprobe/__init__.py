"""pytest-msprobe: every API call of an msprobe dump.json becomes a pytest item."""
from __future__ import annotations

__version__ = "0.1.0"
