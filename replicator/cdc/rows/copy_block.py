"""Many plain changes of one table into COPY text rows at once, with numpy: the drain's hot
path for large batches.

copy_rows.plain_line turns one pgoutput message into its staging row in a Python loop over
its columns: about 4 microseconds a change, most of the drain's Python time on a million
changes. Here the messages staged for a table since the last flush are joined into one
buffer and every column of every message is located at once (one vectorized pass per
column over all the messages).

Only plain changes are done here, as plain_line defines them (an insert, an update that kept
its key under the default replica identity, a delete by key), and only those whose values
hold no character COPY's text format reserves and no empty string, whose column count is the
table's and whose sequence number fits the ten digits written. Every other message is
returned by index, for the per-message path (copy_rows.change and the stager), which
escapes, resolves unchanged TOASTed values and moves keys.

A row here is its message less the headers: each value keeps the byte before it, which
becomes its tab, and a NULL's one byte becomes the tab of an empty field. So the rows are
read with `NULL ''` (an empty string went the other way), have no unchanged-columns field
(the staging column's default says none, and the destination parses no empty array per
row), and carry the sequence number zero-padded to ten digits (COPY reads "0000000042" as
42). Two passes over the bytes make them: a mask keeps what stays, and a second one puts
each row's sequence number and op in front.

Pure: bytes in, bytes out; never talks to a database.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .copy_rows import DELETE, INSERT, NULL, UPDATE

_TEXT, _NULL, _NEW, _KEY = ord("t"), ord("n"), ord("N"), ord("K")
_DIGITS = 10
_MAX_SEQ = 10**_DIGITS
_POWERS = 10 ** np.arange(_DIGITS - 1, -1, -1, dtype=np.int64)
# a row's start: newline (dropped before the first row), seq, tab, op
_PREFIX = 1 + _DIGITS + 1 + 1
_HEADER = 8  # kind, relation, tuple marker, column count
_SIZE_BYTES = 4  # a text value's kind byte and the first three of its size
_PAD = bytes(8)  # after the messages: a read of a few bytes at any offset stays inside


def _view(data: np.ndarray, dtype: str, width: int) -> np.ndarray:
    """`data` as overlapping items of `width` bytes, one starting at each byte: a gather
    or a store of one item at an offset reads or writes those bytes at once (a multi-byte
    integer's, or a run of bytes)."""
    return np.ndarray((len(data) - width + 1,), dtype=dtype, buffer=data, strides=(1,))


@dataclass
class Frames:
    """Where the parts of each message are, in all the messages joined (plain_block's and
    binary_block's common first pass): `ok` holds for an I, U or D message of the table's
    width whose every value is `value_kind` or NULL and ends inside it, as plain_line
    defines a plain change."""

    joined: bytes  # the messages, then _PAD: a read of a few bytes at any offset stays inside
    data: np.ndarray  # `joined` as bytes
    sizes: np.ndarray  # each message's
    starts: np.ndarray
    kind: np.ndarray  # each message's first byte: I, U or D for a plain change
    ok: np.ndarray
    value_start: np.ndarray  # (messages, columns): where each value's bytes start
    value_size: np.ndarray  # 0 for a NULL
    present: np.ndarray  # the value is not NULL

    @property
    def last(self) -> int:
        """The end of the messages' bytes."""
        return len(self.data) - len(_PAD)


def frames(messages: list[bytes], columns: int, value_kind: int, empty: bool) -> Frames:
    """Every message's parts at once (one vectorized pass per column over all of them);
    `empty`: an empty value is plain (binary: its size tells it from NULL; text: it is
    not, COPY's NULL '' would read it as NULL)."""
    joined = b"".join([*messages, _PAD])
    data = np.frombuffer(joined, dtype=np.uint8)
    size_at = _view(data, ">u4", 4)  # a value's size, from its offset
    last = len(data) - len(_PAD)  # reads at offsets clipped here stay inside
    count = len(messages)
    sizes = np.fromiter(map(len, messages), dtype=np.int64, count=count)
    ends = np.cumsum(sizes)
    starts = ends - sizes

    def at(offsets: np.ndarray) -> np.ndarray:
        """The byte at each offset (clipped into the buffer: a short message reads its
        neighbour's bytes, and is refused by its bounds check instead)."""
        return data[np.minimum(offsets, last)].astype(np.int64)

    kind, marker = at(starts), at(starts + 5)
    ok = (sizes >= 8) & (
        ((kind == INSERT) & (marker == _NEW))
        | ((kind == UPDATE) & (marker == _NEW))
        | ((kind == DELETE) & (marker == _KEY))
    )
    ok &= (at(starts + 6) << 8 | at(starts + 7)) == columns
    value_starts, value_sizes, present = [], [], []
    position = starts + 8
    for _ in range(columns):
        column_kind = at(position)
        value = column_kind == value_kind
        ok &= value | (column_kind == _NULL)
        size = np.where(value, size_at[np.minimum(position + 1, last)].astype(np.int64), 0)
        start = np.where(value, position + 5, position + 1)
        end = start + size
        ok &= end <= ends
        if not empty:
            ok &= (size > 0) | ~value
        value_starts.append(start)
        value_sizes.append(size)
        present.append(value)
        position = np.where(ok, end, starts)  # a refused message stays in its own bytes
    ok &= position == ends
    return Frames(
        joined,
        data,
        sizes,
        starts,
        kind,
        ok,
        np.stack(value_starts, axis=1),
        np.stack(value_sizes, axis=1),
        np.stack(present, axis=1),
    )


@dataclass
class Block:
    """What `plain_block` made of a list of messages."""

    # COPY text rows (seq, op, then the table's columns; NULL is the empty field),
    # newline-separated, without a final newline (binary_block's: COPY binary rows)
    rows: bytes
    keys: list[bytes | tuple[bytes, ...]]  # each row's key fields, as Stager.note_key takes them
    others: list[int]  # indexes of the messages left to the per-message path
    updates: int = 0  # of the rows, the updates (op U)


def plain_block(
    messages: list[bytes], seqs: list[int], columns: int, key_positions: tuple[int, ...]
) -> Block:
    """The COPY rows of the plain changes among `messages` (one table's, in order, with
    their sequence numbers), and the indexes of the other messages."""
    count = len(messages)
    if count == 0 or columns == 0:
        return Block(b"", [], list(range(count)))
    framed = frames(messages, columns, _TEXT, empty=False)
    data, sizes, starts, kind, ok = framed.data, framed.sizes, framed.starts, framed.kind, framed.ok
    value_start, value_size, text_v = framed.value_start, framed.value_size, framed.present
    seq = np.asarray(seqs, dtype=np.int64)
    ok &= (seq >= 0) & (seq < _MAX_SEQ)
    ok &= ~_reserved_inside(data, value_start, value_size, ok, starts)

    chosen = np.flatnonzero(ok)
    others = np.flatnonzero(~ok).tolist()
    if chosen.size == 0:
        return Block(b"", [], others)
    starts_v, sizes_v, text_v = value_start[chosen], value_size[chosen], text_v[chosen]
    keys = _keys(data, starts_v, sizes_v, text_v, key_positions)

    rows = chosen.size
    # the rows are the chosen messages' bytes less their headers: each value keeps the byte
    # before it (its size's last, or the NULL's kind byte), which becomes its tab; a NULL is
    # the empty field (the COPY's NULL '')
    source = data[: framed.last].copy()
    source[starts_v - 1] = ord("\t")
    keep = np.repeat(ok, sizes)
    _view(keep, "V8", _HEADER)[starts[chosen]] = np.void(bytes(_HEADER))
    _view(keep, "V4", _SIZE_BYTES)[starts_v[text_v] - 5] = np.void(bytes(_SIZE_BYTES))
    body = source[keep]

    prefix = np.empty((rows, _PREFIX), dtype=np.uint8)
    prefix[:, 0] = ord("\n")
    prefix[:, 1 : 1 + _DIGITS] = (seq[chosen, None] // _POWERS) % 10 + ord("0")
    prefix[:, 1 + _DIGITS] = ord("\t")
    prefix[:, 2 + _DIGITS] = kind[chosen]  # I, U or D: the op is the message's kind
    lengths = _PREFIX + (sizes_v + 1).sum(axis=1)
    row_starts = np.cumsum(lengths) - lengths
    out = np.empty(int(row_starts[-1] + lengths[-1]), dtype=np.uint8)
    _view(out, f"V{_PREFIX}", _PREFIX)[row_starts] = prefix.view(f"V{_PREFIX}").ravel()
    is_body = np.ones(len(out), dtype=bool)
    _view(is_body, f"V{_PREFIX}", _PREFIX)[row_starts] = np.void(bytes(_PREFIX))
    out[is_body] = body
    updates = int(np.count_nonzero(kind[chosen] == UPDATE))
    return Block(out[1:].tobytes(), keys, others, updates)


def _reserved_inside(
    data: np.ndarray, starts: np.ndarray, sizes: np.ndarray, ok: np.ndarray, first: np.ndarray
) -> np.ndarray:
    """Which messages hold a character COPY's text format reserves (backslash, newline,
    carriage return, tab) inside a value (their sizes and headers may hold such bytes too:
    those do not count)."""
    found = np.flatnonzero((data == 92) | (data == 10) | (data == 13) | (data == 9))
    if found.size == 0:
        return np.zeros(len(ok), dtype=bool)
    columns = starts.shape[1]
    # refused messages' ranges collapse to their first byte: the ranges stay sorted
    flat_starts = np.where(ok[:, None], starts, first[:, None]).ravel()
    flat_ends = flat_starts + np.where(ok[:, None], sizes, 0).ravel()
    value = np.searchsorted(flat_starts, found, side="right") - 1
    hit = (value >= 0) & (found < flat_ends[np.maximum(value, 0)])
    inside = np.zeros(len(ok), dtype=bool)
    inside[value[hit] // columns] = True
    return inside


def _keys(
    data: np.ndarray,
    starts: np.ndarray,
    sizes: np.ndarray,
    text: np.ndarray,
    positions: tuple[int, ...],
) -> list[bytes | tuple[bytes, ...]]:
    """Each row's key fields as plain_line writes them (a NULL as its marker). A column's
    values are gathered into a fixed-width bytes array, zero-padded, whose `tolist` strips
    the padding: exact, since no value in text form holds a zero byte."""
    columns = []
    for p in positions:
        width = max(int(sizes[:, p].max()), 1)
        offsets = np.arange(width)
        matrix = data[np.minimum(starts[:, p, None] + offsets, len(data) - 1)]
        matrix[offsets >= sizes[:, p, None]] = 0
        fields = matrix.view(f"S{width}").ravel().tolist()
        for row in np.flatnonzero(~text[:, p]).tolist():
            fields[row] = NULL
        columns.append(fields)
    if len(columns) == 1:
        return columns[0]  # type: ignore[no-any-return]
    return list(zip(*columns, strict=True)) if columns else [() for _ in range(len(starts))]
