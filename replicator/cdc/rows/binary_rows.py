"""Row changes with binary values (pgoutput's `binary`) into COPY binary rows, one change at a
time: what copy_rows does for text values, for the changes cdc/rows/binary_block.py leaves
(an unchanged TOASTed value, a moved key, an old row, a flush of few changes).

A binary value arrives as `b`, its size and its bytes, and goes on as its size and its bytes;
NULL is None here (any bytes may be a value), and a row's unchanged columns go in COPY's
binary form of an `int2[]`.
"""

from __future__ import annotations

import struct

from ..source.pgoutput import UNCHANGED, DecodeError, Unchanged
from .copy_rows import DELETE, INSERT

BinaryField = bytes | None | Unchanged
_COUNT = struct.Struct(">h")
_SIZE = struct.Struct(">i")
_BINARY, _NULL, _UNCHANGED, _NEW = ord("b"), ord("n"), ord("u"), ord("N")
_KEY, _OLD = ord("K"), ord("O")
_NULL_FIELD = b"\xff\xff\xff\xff"
_INT2 = 21  # int2's type OID, in an array's binary form
# COPY's binary format: its signature, flags and header extension size; its end
HEADER = b"PGCOPY\n\xff\r\n\x00" + bytes(8)
TRAILER = b"\xff\xff"
# a row's start: its field count, seq's size, (seq), op's size
_START = struct.Struct(">hiqi")


def fields(data: bytes, at: int) -> tuple[list[BinaryField], int]:
    """One tuple's values (NULL as None, UNCHANGED kept), and where the next part of the
    message starts."""
    (count,) = _COUNT.unpack_from(data, at)
    at += 2
    out: list[BinaryField] = []
    for _ in range(count):
        kind = data[at]
        if kind == _BINARY:
            (size,) = _SIZE.unpack_from(data, at + 1)
            start = at + 5
            at = start + size
            out.append(data[start:at])
        elif kind == _NULL:
            out.append(None)
            at += 1
        elif kind == _UNCHANGED:
            out.append(UNCHANGED)
            at += 1
        else:
            raise DecodeError(f"pgoutput column kind {chr(kind)!r} (binary values were asked)")
    return out, at


def change(
    data: bytes,
) -> tuple[int, list[BinaryField] | None, bool, list[BinaryField] | None]:
    """An I, U or D message: (kind, old tuple or None, whether old holds only the key, new
    tuple or None)."""
    kind, marker = data[0], data[5]
    if kind == INSERT or marker == _NEW:
        new, _ = fields(data, 6)
        return kind, None, False, new
    if marker not in (_KEY, _OLD):
        raise DecodeError(f"pgoutput change with tuple marker {chr(marker)!r}")
    old, at = fields(data, 6)
    if kind == DELETE:
        return kind, old, marker == _KEY, None
    if data[at] != _NEW:
        raise DecodeError("pgoutput update without its new tuple")
    new, _ = fields(data, at + 1)
    return kind, old, marker == _KEY, new


def row(seq: int, op: bytes, values: list[BinaryField]) -> bytes:
    """A staging row in COPY's binary format: seq, op, the unchanged columns (1-based
    positions; their values NULL), then the values."""
    unchanged = [i + 1 for i, v in enumerate(values) if v is UNCHANGED]
    parts = [_START.pack(len(values) + 3, 8, seq, 1), op, _positions(unchanged)]
    for value in values:
        if value is None or value is UNCHANGED:
            parts.append(_NULL_FIELD)
        else:
            assert isinstance(value, bytes)
            parts.append(_SIZE.pack(len(value)))
            parts.append(value)
    return b"".join(parts)


def _positions(positions: list[int]) -> bytes:
    """An `int2[]` field: its size, then the array (dimensions, a flags word, the element
    type, each dimension's length and lower bound, each element's size and value)."""
    if not positions:
        array = struct.pack(">iii", 0, 0, _INT2)
    else:
        count = len(positions)
        array = struct.pack(f">iiiii{'ih' * count}", 1, 0, _INT2, count, 1, *_sized(positions))
    return _SIZE.pack(len(array)) + array


def _sized(positions: list[int]) -> list[int]:
    return [part for p in positions for part in (2, p)]
