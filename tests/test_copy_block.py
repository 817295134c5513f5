"""cdc/rows/copy_block.py against the per-message path it stands in for: the same COPY rows
for every plain change, every other message left to the per-message path."""

from __future__ import annotations

import struct

from hypothesis import given, settings
from hypothesis import strategies as st

from replicator.cdc.rows.binary_block import binary_block
from replicator.cdc.rows.binary_rows import change as binary_change
from replicator.cdc.rows.copy_block import plain_block
from replicator.cdc.rows.copy_rows import plain_line
from replicator.cdc.source.pgoutput import UNCHANGED as UNCHANGED_VALUE
from replicator.cdc.source.pgoutput import Delete, decode

UNCHANGED = object()
OID = struct.pack(">I", 16384)

# values COPY takes as they are, and values it reserves characters in (never a zero byte: a
# type's text output is a C string)
values = st.one_of(
    st.none(),
    st.just(UNCHANGED),
    st.binary(max_size=12).map(lambda b: b.replace(b"\0", b"0")),
    st.text(alphabet="ab\t\n\r\\é", max_size=6).map(str.encode),
    st.sampled_from([b"", b"\\N", b"t", b"\n" * 10, b"x" * 92]),
)


def _tuple(columns: list) -> bytes:
    out = struct.pack(">h", len(columns))
    for value in columns:
        if value is None:
            out += b"n"
        elif value is UNCHANGED:
            out += b"u"
        else:
            out += b"t" + struct.pack(">i", len(value)) + value
    return out


@st.composite
def messages(draw, width: int):
    """One I, U or D message of a `width`-column table (sometimes of another width)."""
    count = draw(st.sampled_from([width, width, width, width + 1]))
    new = draw(st.lists(values, min_size=count, max_size=count))
    old = draw(st.lists(values, min_size=count, max_size=count))
    kind = draw(st.sampled_from(["I", "U", "U+old", "D", "D+full"]))
    marker = draw(st.sampled_from([b"K", b"O"]))
    if kind == "I":
        return b"I" + OID + b"N" + _tuple(new)
    if kind == "U":
        return b"U" + OID + b"N" + _tuple(new)
    if kind == "U+old":
        return b"U" + OID + marker + _tuple(old) + b"N" + _tuple(new)
    return b"D" + OID + (b"K" if kind == "D" else b"O") + _tuple(old)


def _plain(message: bytes, width: int) -> bool:
    """What the block must take: plain_line's changes of the table's width whose values hold
    no character COPY reserves and no empty string."""
    line = plain_line(message, 0)
    if line is None or len(line) != width + 1:
        return False
    decoded = decode(message, raw=True)
    row = decoded.old if isinstance(decoded, Delete) else decoded.new
    return not any(v == b"" or (v and any(c in v for c in b"\\\n\r\t")) for v in row)


@settings(max_examples=300, deadline=None)
@given(
    st.integers(1, 4).flatmap(
        lambda width: st.tuples(
            st.just(width),
            st.lists(messages(width), max_size=40),
            st.lists(st.integers(0, 2 * 10**10), min_size=40, max_size=40),
            st.lists(st.integers(0, width - 1), min_size=1, max_size=2, unique=True),
        )
    )
)
def test_the_block_writes_plain_lines_rows_and_leaves_the_others(case):
    width, batch, seqs, key = case
    seqs = seqs[: len(batch)]
    block = plain_block(batch, seqs, width, tuple(key))

    taken = [i for i in range(len(batch)) if i not in set(block.others)]
    rows = block.rows.split(b"\n") if block.rows else []
    assert len(rows) == len(taken) == len(block.keys)
    for i, row, keys in zip(taken, rows, block.keys, strict=True):
        expected = plain_line(batch[i], seqs[i])
        assert expected is not None and seqs[i] < 10**10
        seq, op, *values = row.split(b"\t")
        assert len(seq) == 10
        # plain_line's row, but for its unchanged columns (none: the staging default) and
        # its NULLs (empty fields, read with NULL '')
        expected_seq, expected_op, unchanged, *expected_values = b"\t".join(expected).split(b"\t")
        assert (int(seq), op, unchanged) == (int(expected_seq), expected_op, b"{}")
        assert b"" not in expected_values  # an empty string is the per-message path's
        assert values == [b"" if v == b"\\N" else v for v in expected_values]
        fields = [expected[1 + p] for p in key]
        assert keys == (fields[0] if len(key) == 1 else tuple(fields))
    for i in block.others:  # left only when the per-message path has something to do
        assert not _plain(batch[i], width) or seqs[i] >= 10**10


def test_no_messages_and_only_others():
    assert plain_block([], [], 2, (0,)).others == []
    move = b"U" + OID + b"K" + _tuple([b"1", None]) + b"N" + _tuple([b"2", b"x"])
    block = plain_block([move, b"I"], [2, 4], 2, (0,))
    assert (block.rows, block.others) == (b"", [0, 1])


binary_values = st.one_of(
    st.none(), st.just(UNCHANGED), st.binary(max_size=6), st.sampled_from([b"\0", b"\1\0"])
)


@st.composite
def binary_messages(draw, width: int):
    """messages(), with values in binary form: any bytes, zero bytes and empty ones too."""
    message = draw(messages(width))
    count = draw(st.sampled_from([width, width, width, width + 1]))
    values = draw(st.lists(binary_values, min_size=2 * count, max_size=2 * count))
    return _binary(message, iter(values))


def _binary(message: bytes, values=None) -> bytes:
    """The message with its values in binary form (`b` for `t`: the bytes are the same)."""
    decoded = decode(message, raw=True)
    marker = message[5:6]
    old, new = getattr(decoded, "old", None), getattr(decoded, "new", None)
    rows = [old] if isinstance(decoded, Delete) else [old, new]
    tuples = [
        struct.pack(">h", len(row))
        + b"".join(_binary_value(v if values is None else next(values, v)) for v in row)
        for row in rows
        if row is not None
    ]
    if isinstance(decoded, Delete) or marker == b"N":
        return message[:6] + tuples[-1]
    return message[:6] + tuples[0] + b"N" + tuples[1]


def _binary_value(value) -> bytes:
    if value is None:
        return b"n"
    if value is UNCHANGED_VALUE or value is UNCHANGED:
        return b"u"
    return b"b" + struct.pack(">i", len(value)) + value


def _fields(row: bytes, at: int, count: int) -> tuple[list[bytes | None], int]:
    values: list[bytes | None] = []
    for _ in range(count):
        (size,) = struct.unpack_from(">i", row, at)
        at += 4
        values.append(None if size == -1 else row[at : at + size])
        at += max(size, 0)
    return values, at


@settings(max_examples=300, deadline=None)
@given(
    st.integers(1, 4).flatmap(
        lambda width: st.tuples(
            st.just(width),
            st.lists(binary_messages(width), max_size=40),
            st.lists(st.integers(0, 2**62), min_size=40, max_size=40),
            st.lists(st.integers(0, width - 1), min_size=1, max_size=2, unique=True),
        )
    )
)
def test_the_binary_block_writes_the_rows_of_the_per_message_path(case):
    """binary_block's rows are binary_rows.row's (less the unchanged columns, which the
    staging default fills) for every plain change: empty values and any bytes included."""
    width, batch, seqs, key = case
    seqs = seqs[: len(batch)]
    block = binary_block(batch, seqs, width, tuple(key))
    taken = [i for i in range(len(batch)) if i not in set(block.others)]
    at = 0
    for i, keys in zip(taken, block.keys, strict=True):
        kind, old, old_is_key, new = binary_change(batch[i])
        values = old if kind == ord("D") else new
        assert (old is None or (kind == ord("D") and old_is_key)) and UNCHANGED_VALUE not in values
        assert len(values) == width
        (count,) = struct.unpack_from(">h", block.rows, at)
        (seq, op), at = _fields(block.rows, at + 2, 2)
        row, at = _fields(block.rows, at, width)
        assert (count, int.from_bytes(seq, "big"), op) == (width + 2, seqs[i], bytes([kind]))
        assert row == values
        fields = [values[p] for p in key]  # exact: a key ends in a zero byte, or is NULL
        assert keys == (fields[0] if len(key) == 1 else tuple(fields))
    assert at == len(block.rows)
    for i in block.others:  # an old row, an unchanged value or another width
        kind, old, old_is_key, new = binary_change(batch[i])
        values = old if kind == ord("D") else new
        plain = old is None or (kind == ord("D") and old_is_key)
        assert not plain or UNCHANGED_VALUE in values or len(values) != width
