"""Many plain changes of one table into COPY binary rows at once, with numpy: the drain's hot
path when the stream sends values in their types' binary form (pgoutput's `binary`).

A binary value arrives as `b`, its size and its bytes; COPY's binary format wants its size
and its bytes: so a row is its message less the header and each value's kind byte, with a
NULL's kind byte become a size of -1, behind the row's field count, sequence number and op.
Nothing is escaped, and an empty value is told from NULL by its size.

Pure: bytes in, bytes out; never talks to a database.
"""

from __future__ import annotations

import numpy as np

from .binary_rows import BinaryField
from .copy_block import Block, _view, frames
from .copy_rows import UPDATE

_BINARY = ord("b")
_PREFIX = 2 + 4 + 8 + 4 + 1  # field count; seq's size and value; op's size and value
_NULL_SIZE = np.void(b"\xff\xff\xff\xff")


def binary_block(
    messages: list[bytes], seqs: list[int], columns: int, key_positions: tuple[int, ...]
) -> Block:
    """The COPY binary rows of the plain changes among `messages` (one table's, in order,
    with their sequence numbers), and the indexes of the other messages."""
    count = len(messages)
    if count == 0 or columns == 0:
        return Block(b"", [], list(range(count)))
    framed = frames(messages, columns, _BINARY, empty=True)
    data, sizes, starts, kind, ok = framed.data, framed.sizes, framed.starts, framed.kind, framed.ok

    chosen = np.flatnonzero(ok)
    others = np.flatnonzero(~ok).tolist()
    if chosen.size == 0:
        return Block(b"", [], others)
    starts_v, sizes_v = framed.value_start[chosen], framed.value_size[chosen]
    value_v = framed.present[chosen]
    kind_at = np.where(value_v, starts_v - 5, starts_v - 1)  # each value's kind byte
    keys = _keys(framed.joined, data, starts_v, sizes_v, value_v, key_positions)

    rows = chosen.size
    keep = np.repeat(ok, sizes)  # what stays: each value's size and bytes
    _view(keep, "V8", 8)[starts[chosen]] = np.void(bytes(8))
    keep[kind_at.ravel()] = False
    body = data[: framed.last][keep]

    fields = 4 + sizes_v  # each field's size in the row: its size's 4 bytes, then its bytes
    lengths = _PREFIX + fields.sum(axis=1)
    row_starts = np.cumsum(lengths) - lengths
    field_starts = row_starts[:, None] + _PREFIX + np.cumsum(fields, axis=1) - fields
    nulls = field_starts[~value_v]
    out = np.empty(int(row_starts[-1] + lengths[-1]), dtype=np.uint8)
    is_body = np.ones(len(out), dtype=bool)
    _view(is_body, f"V{_PREFIX}", _PREFIX)[row_starts] = np.void(bytes(_PREFIX))
    _view(is_body, "V4", 4)[nulls] = np.void(bytes(4))
    out[is_body] = body
    prefix = np.zeros((rows, _PREFIX), dtype=np.uint8)
    prefix[:, 0], prefix[:, 1] = (columns + 2) >> 8, (columns + 2) & 0xFF
    prefix[:, 5] = 8
    prefix[:, 6:14] = np.asarray(seqs, dtype=">i8")[chosen].view(np.uint8).reshape(rows, 8)
    prefix[:, 17] = 1
    prefix[:, 18] = kind[chosen]
    _view(out, f"V{_PREFIX}", _PREFIX)[row_starts] = prefix.view(f"V{_PREFIX}").ravel()
    _view(out, "V4", 4)[nulls] = _NULL_SIZE
    updates = int(np.count_nonzero(kind[chosen] == UPDATE))
    return Block(out.tobytes(), keys, others, updates)


def _keys(
    joined: bytes,
    data: np.ndarray,
    starts: np.ndarray,
    sizes: np.ndarray,
    value: np.ndarray,
    positions: tuple[int, ...],
) -> list[BinaryField | tuple[BinaryField, ...]]:
    """Each row's key values as binary_rows.fields gives them (a NULL as None): the exact
    bytes, which may end in zero bytes (copy_block's zero-padded gather would drop those,
    and a key would not match its own per-message spelling). A column whose values all have
    one size (int, bigint, uuid) is gathered into a fixed-width array at once; others are
    sliced one by one."""
    columns = []
    for p in positions:
        size, present = sizes[:, p], value[:, p]
        width = int(size.max())
        if width > 0 and bool((size[present] == width).all()):
            matrix = data[np.minimum(starts[:, p, None] + np.arange(width), len(data) - 1)]
            fields = matrix.view(f"V{width}").ravel().tolist()
            for row in np.flatnonzero(~present).tolist():
                fields[row] = None
        else:
            spans = zip(starts[:, p].tolist(), size.tolist(), present.tolist(), strict=True)
            fields = [joined[s : s + n] if v else None for s, n, v in spans]
        columns.append(fields)
    if len(columns) == 1:
        return columns[0]  # type: ignore[no-any-return]
    return list(zip(*columns, strict=True)) if columns else [() for _ in range(len(starts))]
