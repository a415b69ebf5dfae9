"""numba's njit with the flags every compiled pass of the package needs (inputs/draw.py, metrics/numba_kernel.py,
verdict/strict/numba_kernel.py), so they are set once. Imported by those modules only, at the first item, never at
collection."""
from __future__ import annotations

from typing import Any, Callable, TypeVar, cast

from numba import njit

_F = TypeVar("_F", bound=Callable[..., Any])


def compiled(fn: _F) -> _F:
    """numba's njit with IEEE arithmetic (no fastmath), numpy's error model (x / 0 is inf, not an
    exception), no GIL (the helper thread runs a check or a draw beside the item's thread), and the compiled
    code cached on disk (numba's cache: __pycache__ beside the module, else NUMBA_CACHE_DIR or ~/.cache)."""
    return cast(_F, njit(cache=True, nogil=True, error_model="numpy")(fn))
