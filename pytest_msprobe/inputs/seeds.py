"""Per-item seeds: reproducible for one item alone, independent of order, worker and resume."""
from __future__ import annotations

import zlib

# The generator of random inputs (inputs/draw.py). A journal's records were made with the one it names:
# resume (session/journal.run_fingerprint) reruns the items of a journal written with another.
GENERATOR = "splitmix64-counter"


def item_seed(run_seed: int, api_full_name: str) -> int:
    """Seed of one API call; forward and backward items share it so they replay the same call."""
    return zlib.crc32(f"{run_seed}:{api_full_name}".encode()) & 0x7FFFFFFF
