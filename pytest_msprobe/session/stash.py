"""The key under which the resolved settings live on config.stash (settings.py stays pytest-free)."""
from __future__ import annotations

import pytest

from ..settings import Settings

SETTINGS_KEY = pytest.StashKey[Settings]()
