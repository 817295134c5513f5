"""Decoding pgoutput, PostgreSQL's logical replication protocol (version 1), one message at a
time: what each XLogData message of a replication stream carries (cdc/source/log_stream.py), and
what each row of `pg_logical_slot_peek_binary_changes(slot, ..., 'proto_version', '1',
'publication_names', ...)` carries in its `data` column (cdc/pending.py).

There is no maintained Python decoder to build on, and the format is small (PostgreSQL
documentation, "Logical Replication Message Formats"): Begin, Commit, Origin, Relation,
Type, Insert, Update, Delete, Truncate; integers are big-endian, strings NUL-terminated,
and column values arrive as text (or NULL, or "unchanged TOASTed value").

Pure: it reads bytes and never talks to a database.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from ...base.errors import ReplicatorError

# pgoutput timestamps count microseconds from 2000-01-01 (PostgreSQL's epoch).
_EPOCH = datetime(2000, 1, 1, tzinfo=UTC)


class Unchanged:
    """A TOASTed value the change did not touch: the destination keeps the value it has."""

    _instance: Unchanged | None = None

    def __new__(cls) -> Unchanged:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "UNCHANGED"


UNCHANGED = Unchanged()

Value = str | bytes | None | Unchanged
Row = tuple[Value, ...]


@dataclass(frozen=True)
class Begin:
    final_lsn: int
    committed_at: datetime
    xid: int


@dataclass(frozen=True)
class Commit:
    lsn: int
    end_lsn: int
    committed_at: datetime


@dataclass(frozen=True)
class Origin:
    lsn: int
    name: str


@dataclass(frozen=True)
class RelationColumn:
    name: str
    type_oid: int
    type_modifier: int
    in_key: bool  # part of the replica identity


@dataclass(frozen=True)
class Relation:
    """A table's shape as the log describes it, sent before its first change in a session
    and again after it changed: the log's own view of schema drift."""

    oid: int
    schema: str
    name: str
    replica_identity: str  # d (default), n (nothing), f (full), i (index)
    columns: tuple[RelationColumn, ...]


@dataclass(frozen=True)
class Type:
    oid: int
    schema: str
    name: str


@dataclass(frozen=True)
class Insert:
    relation: int
    new: Row


@dataclass(frozen=True)
class Update:
    relation: int
    new: Row
    old: Row | None = None  # with the key changed (old key) or REPLICA IDENTITY FULL
    old_is_key: bool = False  # `old` holds the key columns only (the others are None)


@dataclass(frozen=True)
class Delete:
    relation: int
    old: Row
    old_is_key: bool  # True: only the replica identity's columns are set


@dataclass(frozen=True)
class Truncate:
    relations: tuple[int, ...]
    cascade: bool
    restart_identity: bool


Message = Begin | Commit | Origin | Relation | Type | Insert | Update | Delete | Truncate


class DecodeError(ReplicatorError):
    """Bytes that are not pgoutput version 1: a bug, or a server speaking another version."""


class _Reader:
    """A cursor over one message's bytes."""

    def __init__(self, data: bytes, raw: bool = False) -> None:
        self.data, self.at, self.raw = data, 0, raw

    def take(self, size: int) -> bytes:
        end = self.at + size
        if end > len(self.data):
            raise DecodeError(f"pgoutput message ends early ({len(self.data)} bytes)")
        chunk, self.at = self.data[self.at : end], end
        return chunk

    def byte(self) -> str:
        return self.take(1).decode("ascii")

    def int8(self) -> int:
        return self.take(1)[0]

    def int16(self) -> int:
        return int(struct.unpack(">h", self.take(2))[0])

    def int32(self) -> int:
        return int(struct.unpack(">i", self.take(4))[0])

    def uint32(self) -> int:
        return int(struct.unpack(">I", self.take(4))[0])

    def int64(self) -> int:
        return int(struct.unpack(">q", self.take(8))[0])

    def lsn(self) -> int:
        return int(struct.unpack(">Q", self.take(8))[0])

    def time(self) -> datetime:
        return _EPOCH + timedelta(microseconds=self.int64())

    def string(self) -> str:
        end = self.data.find(b"\0", self.at)
        if end < 0:
            raise DecodeError("pgoutput string without its NUL terminator")
        text, self.at = self.data[self.at : end].decode(), end + 1
        return text

    def tuple(self) -> Row:
        values: list[Value] = []
        for _ in range(self.int16()):
            kind = self.byte()
            if kind == "n":
                values.append(None)
            elif kind == "u":
                values.append(UNCHANGED)
            elif kind == "t":
                value = self.take(self.int32())
                values.append(value if self.raw else value.decode())
            else:
                raise DecodeError(f"pgoutput column kind {kind!r} (binary values were not asked)")
        return tuple(values)


def decode(data: bytes, raw: bool = False) -> Message:
    """One pgoutput message; with `raw`, column values stay bytes (in the source's encoding,
    as COPY will read them)."""
    read = _Reader(bytes(data), raw)
    kind = read.byte()
    if kind == "B":
        return Begin(read.lsn(), read.time(), read.uint32())
    if kind == "C":
        read.int8()  # flags, unused
        return Commit(read.lsn(), read.lsn(), read.time())
    if kind == "O":
        return Origin(read.lsn(), read.string())
    if kind == "R":
        oid, schema, name = read.uint32(), read.string(), read.string()
        identity = chr(read.int8())
        columns = []
        for _ in range(read.int16()):
            flags = read.int8()
            columns.append(
                RelationColumn(read.string(), read.uint32(), read.int32(), bool(flags & 1))
            )
        return Relation(oid, schema, name, identity, tuple(columns))
    if kind == "Y":
        return Type(read.uint32(), read.string(), read.string())
    if kind == "I":
        oid = read.uint32()
        _expect(read.byte(), "N")
        return Insert(oid, read.tuple())
    if kind == "U":
        oid = read.uint32()
        marker = read.byte()
        old, old_is_key = None, False
        if marker in ("K", "O"):
            old, old_is_key = read.tuple(), marker == "K"
            marker = read.byte()
        _expect(marker, "N")
        return Update(oid, read.tuple(), old, old_is_key)
    if kind == "D":
        oid = read.uint32()
        marker = read.byte()
        if marker not in ("K", "O"):
            raise DecodeError(f"pgoutput delete with tuple marker {marker!r}")
        return Delete(oid, read.tuple(), marker == "K")
    if kind == "T":
        count, options = read.int32(), read.int8()
        oids = tuple(read.uint32() for _ in range(count))
        return Truncate(oids, bool(options & 1), bool(options & 2))
    raise DecodeError(f"pgoutput message kind {kind!r} is not one of version 1's")


def _expect(found: str, wanted: str) -> None:
    if found != wanted:
        raise DecodeError(f"pgoutput: expected tuple marker {wanted!r}, got {found!r}")
