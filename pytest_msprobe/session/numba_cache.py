"""Whether numba's cache already holds the compiled checks, read from the file system without importing numba: the
terminal says "compiling" only when the first item will compile (30-60 s on two cores), not when it loads them."""
from __future__ import annotations

import hashlib
import os
import sys
from pathlib import Path

PACKAGE = Path(os.path.abspath(__file__)).parents[1]  # as numba names it (no symlinks resolved)
# the modules whose njit functions the first item compiles (compiled.py's cache=True)
COMPILED_MODULES = ("metrics/numba_kernel.py", "verdict/strict/numba_kernel.py", "inputs/draw.py")


def _cache_dirs(source: Path) -> list[Path]:
    """Where numba looks for a module's cache: NUMBA_CACHE_DIR alone when set, else __pycache__ beside the module,
    else the user-wide cache (numba.core.caching's locators, in their order)."""
    subpath = f"{source.parent.name}_{hashlib.sha1(str(source.parent).encode()).hexdigest()}"
    if os.environ.get("NUMBA_CACHE_DIR"):
        return [Path(os.environ["NUMBA_CACHE_DIR"]) / subpath]
    user = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "numba" / subpath
    return [source.parent / "__pycache__", user]


def checks_cached() -> bool:
    """True when every compiled module has an index of cached functions for this Python (a cache of another numba
    or CPU still recompiles: the notice then words it as a slow load)."""
    tag = f"py{sys.version_info[0]}{sys.version_info[1]}"
    for module in COMPILED_MODULES:
        source = PACKAGE / module
        if not any(any(d.glob(f"{source.stem}.*.{tag}.nbi")) for d in _cache_dirs(source) if d.is_dir()):
            return False
    return True
