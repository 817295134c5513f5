"""Many plain changes of one table into COPY text rows at once, with numpy: the drain's hot
path for large batches.

copy_rows.plain_line turns one pgoutput message into its staging row in a Python loop over
its columns: about 4 microseconds a change, most of the drain's Python time on a million
changes. Here the messages staged for a table since the last flush are joined into one
buffer, every column of every message is located at once (one pass per column over all the
messages, each vectorized), and the rows are gathered from the buffer in one copy.

Only plain changes are done here, as plain_line defines them (an insert, an update that kept
its key under the default replica identity, a delete by key), and only those whose values
hold no character COPY's text format reserves, whose column count is the table's and whose
sequence number fits the ten digits written. Every other message is returned by index, for
the per-message path (copy_rows.change and the stager), which escapes, resolves unchanged
TOASTed values and moves keys. The rows written here are byte for byte plain_line's, except
that the sequence number is zero-padded to ten digits (COPY reads "0000000042" as 42).

Pure: bytes in, bytes out; never talks to a database.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .copy_rows import DELETE, INSERT, NULL, UPDATE

_TEXT, _NULL, _NEW, _KEY = ord("t"), ord("n"), ord("N"), ord("K")
_RESERVED = np.zeros(256, dtype=bool)
_RESERVED[[ord("\\"), ord("\n"), ord("\r"), ord("\t")]] = True
_DIGITS = 10
_MAX_SEQ = 10**_DIGITS
_POWERS = 10 ** np.arange(_DIGITS - 1, -1, -1, dtype=np.int64)
# a row's start: newline (dropped before the first row), seq, tab, op, tab, no unchanged columns
_PREFIX = 1 + _DIGITS + 1 + 1 + 3
_NULL_FIELD = np.frombuffer(b"\t\\N", dtype=np.uint8)


@dataclass
class Block:
    """What `plain_block` made of a list of messages."""

    rows: bytes  # COPY text rows, newline-separated, without a final newline
    keys: list[bytes | tuple[bytes, ...]]  # each row's key fields, as Stager.note_key takes them
    others: list[int]  # indexes of the messages left to the per-message path


def plain_block(
    messages: list[bytes], seqs: list[int], columns: int, key_positions: tuple[int, ...]
) -> Block:
    """The COPY rows of the plain changes among `messages` (one table's, in order, with
    their sequence numbers), and the indexes of the other messages."""
    count = len(messages)
    if count == 0 or columns == 0:
        return Block(b"", [], list(range(count)))
    joined = b"".join(messages)
    data = np.frombuffer(joined, dtype=np.uint8)
    last = len(data) - 1
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
    seq = np.asarray(seqs, dtype=np.int64)
    ok &= (seq >= 0) & (seq < _MAX_SEQ)

    value_starts, value_sizes, is_text = [], [], []
    position = starts + 8
    for _ in range(columns):
        column_kind = at(position)
        text = column_kind == _TEXT
        ok &= text | (column_kind == _NULL)
        size = at(position + 1) << 24 | at(position + 2) << 16 | at(position + 3) << 8
        size |= at(position + 4)
        size = np.where(text, size, 0)
        start = np.where(text, position + 5, position + 1)
        end = start + size
        ok &= end <= ends
        value_starts.append(start)
        value_sizes.append(size)
        is_text.append(text)
        position = np.where(ok, end, starts)  # a refused message stays in its own bytes
    ok &= position == ends
    value_start = np.stack(value_starts, axis=1)  # (messages, columns)
    value_size = np.stack(value_sizes, axis=1)
    text_v = np.stack(is_text, axis=1)
    ok &= ~_reserved_inside(data, value_start, value_size, ok, starts)

    chosen = np.flatnonzero(ok)
    others = np.flatnonzero(~ok).tolist()
    if chosen.size == 0:
        return Block(b"", [], others)
    starts_v, sizes_v, text_v = value_start[chosen], value_size[chosen], text_v[chosen]
    keys = _keys(joined, starts_v, sizes_v, text_v, key_positions)

    rows = chosen.size
    prefix = np.empty((rows, _PREFIX), dtype=np.uint8)
    prefix[:, 0] = ord("\n")
    prefix[:, 1 : 1 + _DIGITS] = (seq[chosen, None] // _POWERS) % 10 + ord("0")
    prefix[:, 1 + _DIGITS :] = np.frombuffer(b"\tX\t{}", dtype=np.uint8)
    prefix[:, 2 + _DIGITS] = kind[chosen]  # I, U or D: the op is the message's kind
    source = np.concatenate((data, prefix.ravel(), _NULL_FIELD))
    # a text value is taken with the byte before it (its size's last), which becomes a tab
    source[(starts_v - 1)[text_v]] = ord("\t")
    prefix_at = len(data) + _PREFIX * np.arange(rows, dtype=np.int64)
    null_at = len(data) + prefix.size

    piece_starts = np.empty((rows, columns + 1), dtype=np.int64)
    piece_sizes = np.empty((rows, columns + 1), dtype=np.int64)
    piece_starts[:, 0], piece_sizes[:, 0] = prefix_at, _PREFIX
    piece_starts[:, 1:] = np.where(text_v, starts_v - 1, null_at)
    piece_sizes[:, 1:] = np.where(text_v, sizes_v + 1, len(_NULL_FIELD))
    piece_starts, piece_sizes = piece_starts.ravel(), piece_sizes.ravel()
    out_ends = np.cumsum(piece_sizes)
    total = int(out_ends[-1])
    # each output byte's source: a running count that jumps at every piece's first byte
    index_type = np.int32 if len(source) < 2**31 and total < 2**31 else np.int64
    step = np.ones(total, dtype=index_type)
    firsts = out_ends - piece_sizes
    jumps = piece_starts.copy()
    jumps[1:] -= piece_starts[:-1] + piece_sizes[:-1] - 1
    step[firsts] = jumps  # every piece holds a byte at least
    index = np.cumsum(step, dtype=index_type)
    return Block(source[index[1:]].tobytes(), keys, others)


def _reserved_inside(
    data: np.ndarray, starts: np.ndarray, sizes: np.ndarray, ok: np.ndarray, first: np.ndarray
) -> np.ndarray:
    """Which messages hold a character COPY's text format reserves inside a value (their
    sizes and headers may hold such bytes too: those do not count)."""
    found = np.flatnonzero(_RESERVED[data])
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
    joined: bytes,
    starts: np.ndarray,
    sizes: np.ndarray,
    text: np.ndarray,
    positions: tuple[int, ...],
) -> list[bytes | tuple[bytes, ...]]:
    """Each row's key fields as plain_line writes them (a NULL as its marker)."""
    columns = []
    for p in positions:
        firsts, lasts = starts[:, p].tolist(), (starts[:, p] + sizes[:, p]).tolist()
        fields = [joined[s:e] for s, e in zip(firsts, lasts, strict=True)]
        for row in np.flatnonzero(~text[:, p]).tolist():
            fields[row] = NULL
        columns.append(fields)
    if len(columns) == 1:
        return columns[0]  # type: ignore[return-value]
    return list(zip(*columns, strict=True)) if columns else [() for _ in range(len(starts))]
