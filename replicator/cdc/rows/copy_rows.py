"""Row changes straight from pgoutput bytes into COPY text fields: the drain's hot path.

A million-change batch goes through here a million times, so it does not build message
objects (pgoutput.decode does, for the rare messages): it reads a change's relation, its
tuples' values as bytes (already in the type's text output, which COPY reads) and escapes
only values that hold a character COPY's text format reserves. Most messages hold none
anywhere, which one search of the whole message proves (its binary header can hold such a
byte too: then every value is searched).

Most changes are also plain in shape (an insert, an update that kept its key under the
default replica identity, a delete by key; no unchanged TOASTed value): `plain_line` turns
those into their staging row's fields in one pass, a third faster than `change`, which every
other change goes through.
"""

from __future__ import annotations

import re
import struct
from collections.abc import Callable

from ..source.pgoutput import UNCHANGED, DecodeError, Unchanged

NULL = b"\\N"
_SPECIAL = re.compile(rb"[\\\n\r\t]")
_COUNT = struct.Struct(">h")
_SIZE = struct.Struct(">i")
INSERT, UPDATE, DELETE = ord("I"), ord("U"), ord("D")
_TEXT, _NULL, _UNCHANGED, _NEW = ord("t"), ord("n"), ord("u"), ord("N")
_KEY, _OLD = ord("K"), ord("O")

Field = bytes | Unchanged
# a plain change's (kind, tuple marker) -> its staging row's first fields, seq still to fill
_PLAIN = {
    (INSERT, _NEW): b"%d\tI\t{}",
    (UPDATE, _NEW): b"%d\tU\t{}",
    (DELETE, _KEY): b"%d\tD\t{}",
}


def escape(value: bytes) -> bytes:
    """A value for COPY's text format."""
    return (
        value.replace(b"\\", b"\\\\")
        .replace(b"\n", b"\\n")
        .replace(b"\r", b"\\r")
        .replace(b"\t", b"\\t")
    )


def fields(data: bytes, at: int, plain: bool) -> tuple[list[Field], int]:
    """One tuple's values as COPY text fields (NULL as `\\N`, UNCHANGED kept), and where the
    next part of the message starts; `plain`: the message holds no byte COPY reserves."""
    (count,) = _COUNT.unpack_from(data, at)
    at += 2
    out: list[Field] = []
    append, search, unpack = out.append, _SPECIAL.search, _SIZE.unpack_from
    for _ in range(count):
        kind = data[at]
        if kind == _TEXT:
            (size,) = unpack(data, at + 1)
            start = at + 5
            at = start + size
            value = data[start:at]
            append(value if plain or not search(value) else escape(value))
        elif kind == _NULL:
            append(NULL)
            at += 1
        elif kind == _UNCHANGED:
            append(UNCHANGED)
            at += 1
        else:
            raise DecodeError(f"pgoutput column kind {chr(kind)!r} (binary values were not asked)")
    return out, at


def change(data: bytes) -> tuple[int, list[Field] | None, bool, list[Field] | None]:
    """An I, U or D message: (kind, old tuple or None, whether old holds only the key, new
    tuple or None)."""
    kind, marker = data[0], data[5]
    plain = _SPECIAL.search(data) is None
    if kind == INSERT:
        new, _ = fields(data, 6, plain)
        return kind, None, False, new
    if marker == _NEW:  # an update that kept its key, default identity
        new, _ = fields(data, 6, plain)
        return kind, None, False, new
    if marker not in (_KEY, _OLD):
        raise DecodeError(f"pgoutput change with tuple marker {chr(marker)!r}")
    old, at = fields(data, 6, plain)
    if kind == DELETE:
        return kind, old, marker == _KEY, None
    if data[at] != _NEW:
        raise DecodeError("pgoutput update without its new tuple")
    new, _ = fields(data, at + 1, plain)
    return kind, old, marker == _KEY, new


def plain_line(
    data: bytes,
    seq: int,
    prefixes: dict[tuple[int, int], bytes] = _PLAIN,
    search: Callable[..., object] = _SPECIAL.search,
    count_of: Callable[[bytes, int], tuple[int]] = _COUNT.unpack_from,
    size_of: Callable[[bytes, int], tuple[int]] = _SIZE.unpack_from,
) -> list[bytes] | None:
    """A plain change's staging row as COPY fields: `seq`, its op, no unchanged columns, then
    the tuple's values, escaped where they must be (a delete's: the key, the others NULL);
    None for any other change (`change` takes those). The defaults bind what the loop calls
    once, instead of looking them up a million times."""
    prefix = prefixes.get((data[0], data[5]))
    if prefix is None:
        return None
    plain = search(data, 8) is None  # the values and their lengths (a length 10 is "\n")
    out = [prefix % seq]
    append = out.append
    at = 8  # kind, relation, tuple marker, column count
    for _ in range(count_of(data, 6)[0]):
        kind = data[at]
        if kind == _TEXT:
            start = at + 5
            at = start + size_of(data, at + 1)[0]
            value = data[start:at]
            append(value if plain or search(value) is None else escape(value))
        elif kind == _NULL:
            append(NULL)
            at += 1
        else:  # unchanged (or a kind `fields` refuses): the general path
            return None
    return out
