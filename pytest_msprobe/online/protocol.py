"""The wire format of msprobe 1.x-8.1's online pre-check (REFERENCE-msprobe.md §9.2), as plain functions.

A frame is four 8-byte big-endian unsigned integers (body length, sequence number, rank, step), then, when
checksums are on (msprobe's default), the CRC32 of the body as 8 lowercase hex ASCII characters, then the
body: a `torch.save` of msprobe's `ApiData` namedtuple, or the 5 bytes `STOP_`. Every frame is answered by
an ack of 29 bytes: a 5-byte word and the frame's sequence number, rank and step. Torch-free.
"""
from __future__ import annotations

import struct
import zlib
from dataclasses import dataclass

HEADER = struct.Struct("!QQQQ")  # length, sequence number, rank, step
ACK = struct.Struct("!5sQQQ")
CRC_WIDTH = 8

OK = b"OK___"
ERROR = b"ERROR"  # bad CRC: the client sends the frame again
BUSY = b"BUSY_"  # the queue is full: the frame is held until there is room
STOP = b"STOP_"  # body of a client's last frame
OVER = b"OVER_"  # answer to STOP_
KILL = b"KILL_"  # every client has stopped: the session ends
ACKS = (OK, ERROR, BUSY, STOP, OVER, KILL)
KILL_SEQUENCE = 100000000  # msprobe's sequence number on a KILL_ ack

DEFAULT_MAX_FRAME = 4 << 30  # bytes of one body; larger frames are refused before they are read


@dataclass(frozen=True)
class Header:
    length: int
    sequence: int
    rank: int
    step: int


def crc_text(body: bytes | bytearray | memoryview) -> bytes:
    return b"%08x" % zlib.crc32(body)


def frame(body: bytes, sequence: int, rank: int = 0, step: int = 0, check_sum: bool = True) -> bytes:
    """One frame as msprobe's client writes it."""
    return HEADER.pack(len(body), sequence, rank, step) + (crc_text(body) if check_sum else b"") + body


def parse_header(raw: bytes | bytearray | memoryview) -> Header:
    return Header(*HEADER.unpack(raw))


def ack(word: bytes, sequence: int, rank: int, step: int) -> bytes:
    return ACK.pack(word, sequence, rank, step)


def parse_ack(raw: bytes) -> tuple[bytes, int, int, int]:
    word, sequence, rank, step = ACK.unpack(raw)
    return bytes(word), sequence, rank, step


def valid_crc_field(raw: bytes | bytearray) -> bool:
    """msprobe writes 8 lowercase hex digits; anything else is not a frame of its client."""
    return len(raw) == CRC_WIDTH and all(c in b"0123456789abcdef" for c in raw)
