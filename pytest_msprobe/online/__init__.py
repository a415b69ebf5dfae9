"""Online pre-check: msprobe 8.1's NPU-side client (or our own sender) streams each API call of a training
step to a pytest session that checks it as it arrives. protocol.py (the frames), receiver.py and nfs.py (the
transports into a bounded queue), safeload.py (loading without running peer code), spool.py (a call as a
one-call tensor dump), endpoint.py (addresses, TLS), sender.py (`send`, for msprobe 8.2 and later).
The pytest side is session/online.py.
"""
from __future__ import annotations

from typing import Any


def send(address: str, **kwargs: Any) -> Any:
    """`with pytest_msprobe.online.send("tcp://HOST:PORT"): train_step()`: stream the step's torch calls
    (sender.py). Imported lazily: importing the package never imports torch."""
    from .sender import Sender, SendOptions

    return Sender(address, SendOptions(**kwargs))


__all__ = ["send"]
