"""Loading what a peer sent without running anything it chose.

msprobe 8.1.2's receiver loads TCP bodies with `torch.load(weights_only=False)` (any pickle runs) and NFS
files with an unpickler that checks class names but not modules. Here:

* TCP/TLS bodies (`torch.save` zip archives) go through torch's `weights_only` unpickler, with msprobe's
  `ApiData` (a namedtuple, rebuilt as our own) and the argument types msprobe passes (`slice`, `Ellipsis`)
  added to torch's allowlist of tensors, dtypes, devices, sizes and plain containers.
* NFS files (plain pickles whose tensors are nested `torch.save` bytes) go through a `pickle.Unpickler`
  whose `find_class` maps exact (module, name) pairs to safe objects; the nested bytes are loaded with
  `weights_only` again. Anything else (`os.system`, `builtins.eval`, ...) raises before it is looked up.

Every failure is `Refused` with a one-line reason; nothing a peer sent is executed.
"""
from __future__ import annotations

import collections
import io
import pickle
import re
from typing import Any, NamedTuple

import torch

MSPROBE_API_DATA = ("msprobe.pytorch.api_accuracy_checker.common.utils", "ApiData")
_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_]*\.[A-Za-z0-9_.]+\.[0-9]+$")


class ApiData(NamedTuple):
    """msprobe's ApiData: one API call (name without `.forward`), its arguments, its device result."""

    name: str = "unknown"
    args: Any = None
    kwargs: Any = None
    result: Any = None
    step: int = 0
    rank: int = 0


class Refused(Exception):
    """A body that is not a call msprobe's client could have sent; the message is one line."""


def _load_from_bytes(data: bytes) -> Any:
    """torch.storage._load_from_bytes (how a pickled tensor holds its storage), under weights_only."""
    return torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)


def _safe_globals() -> list[Any]:
    return [(ApiData, ".".join(MSPROBE_API_DATA)), slice, (Ellipsis, "builtins.Ellipsis")]


def load_tcp(body: bytes | bytearray) -> ApiData:
    """A TCP/TLS body: torch.save(ApiData)."""
    try:
        with torch.serialization.safe_globals(_safe_globals()):
            obj = torch.load(io.BytesIO(body), map_location="cpu", weights_only=True)
    except Exception as exc:  # UnpicklingError for a refused global, RuntimeError for a bad archive, ...
        raise Refused(_first_line(exc)) from None
    return validate(obj)


_NFS_ALLOWED: dict[tuple[str, str], Any] = {
    MSPROBE_API_DATA: ApiData,
    ("torch.storage", "_load_from_bytes"): _load_from_bytes,
    ("torch._utils", "_rebuild_tensor_v2"): torch._utils._rebuild_tensor_v2,
    ("collections", "OrderedDict"): collections.OrderedDict,
    ("torch", "Size"): torch.Size,
    ("torch", "device"): torch.device,
    ("builtins", "slice"): slice,
    ("builtins", "Ellipsis"): Ellipsis,
}


class _NfsUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        found = _NFS_ALLOWED.get((module, name))
        if found is not None:
            return found
        if module == "torch" and isinstance(getattr(torch, name, None), (torch.dtype, torch.memory_format)):
            return getattr(torch, name)
        short = name.removeprefix("torch.")  # memory formats pickle as (<a torch module>, "torch.<name>")
        if module.startswith("torch") and name.startswith("torch.") and \
                isinstance(getattr(torch, short, None), (torch.dtype, torch.memory_format)):
            return getattr(torch, short)
        raise pickle.UnpicklingError(f"global {module}.{name} is not allowed (only msprobe's ApiData and tensors)")


def load_nfs(data: bytes) -> ApiData | str:
    """An nfs_path file: pickle.dump(ApiData), or the strings "start"/"end" of the markers."""
    try:
        obj = _NfsUnpickler(io.BytesIO(data)).load()
    except Exception as exc:
        raise Refused(_first_line(exc)) from None
    if isinstance(obj, str):
        return obj
    return validate(obj)


def validate(obj: Any) -> ApiData:
    """The loaded object is an ApiData whose name, step and rank msprobe's client could have written."""
    if not isinstance(obj, ApiData):
        raise Refused(f"body holds a {type(obj).__name__}, not msprobe's ApiData")
    if not isinstance(obj.name, str) or not _NAME.match(obj.name) or len(obj.name) > 256:
        raise Refused(f"call name {str(obj.name)[:80]!r} is not Type.api.index")
    if obj.rank is None or obj.step is None:  # a single process: msprobe's frame says rank 0
        obj = obj._replace(rank=obj.rank or 0, step=obj.step or 0)
    for field in ("step", "rank"):
        value = getattr(obj, field)
        if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value < 1 << 31:
            raise Refused(f"{obj.name}: {field} {value!r} is not a small non-negative integer")
    if not isinstance(obj.args, (tuple, list)) or not isinstance(obj.kwargs, dict):
        raise Refused(f"{obj.name}: args must be a tuple and kwargs a dict")
    return obj


_BOILERPLATE = ("Weights only load failed", "Check the documentation", "(1)", "(2)", "\t(")


def _first_line(exc: BaseException) -> str:
    """The line of torch's weights_only message that names what was refused, without its advice."""
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip() and not ln.strip().startswith(_BOILERPLATE)]
    line = lines[0] if lines else (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    line = line.removeprefix("WeightsUnpickler error: ").split(" was not an allowed global", 1)[0]
    return f"{type(exc).__name__}: {line}"[:300]
