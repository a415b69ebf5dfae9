"""Root conftest: what the project's own test-suite needs from pytest (the plugin needs nothing here)."""
from __future__ import annotations

pytest_plugins = ["pytester"]

# `pytest` alone runs tests/; the example and benchmark dumps are collected only when named.
collect_ignore = ["examples", "benchmarks"]
