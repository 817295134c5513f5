"""The slot's stream (cdc/source/log_stream.py) read to the drain's end, cut at commit
boundaries into batches that are staged and handed to the applier one by one (the next batch
is read while the previous one is applied); each time a batch is known applied, the slot may
let go of it (`advance`), so the stream never stops for the applies to catch up.

The destination is idle until the first batch is read, and the last batch is applied with
nothing left to read beside it: so the first batch holds a sixteenth of a full one and each
next one twice its predecessor's, and near the drain's end a batch is cut early at a commit
once it holds as many changes as the rest of the drain is estimated to (from the WAL left
before the drain's end and the changes per byte of WAL so far), halving the batches there.

A transaction bigger than a batch comes whole, streaming into COPY, so memory stays bounded,
and is applied in parts while it is read (applier.submit_part). A table skips transactions
whose commit starts before its applied position: they are in its copy.

A table whose Relation message no longer matches its copy drifted (it reloads), or, when it
takes schema changes in place, stops before that transaction (capture_table.py).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from ..base.identifiers import TableName
from .apply.applier import Applier, Batch
from .capture_table import CaptureTable
from .preflight import IDENTITY_NAMES
from .rows.binary_rows import change as binary_change
from .rows.copy_rows import DELETE, INSERT, UPDATE, change, plain_line
from .rows.stage import Stager
from .rows.table_stage import TableStage
from .source.pgoutput import UNCHANGED, Begin, Commit, Relation, Truncate, decode

_ROW_CHANGES = frozenset((INSERT, UPDATE, DELETE))
RAMP = 16  # the first batch holds this fraction of a full one (see above)
_UNKNOWN = object()  # a relation not yet asked about in the transaction (`_Reader.takers`)


@dataclass
class Read:
    """What one read of the slot saw."""

    changes: int = 0  # handed to the applier
    batches: int = 0
    end: int = 0  # the end of its last commit
    applied: int = 0  # the end of the last batch applied
    hold: int | None = None  # the first commit a table that could not take it has changes in

    def hold_at(self, lsn: int | None) -> None:
        if lsn is not None:
            self.hold = lsn if self.hold is None else min(self.hold, lsn)


@dataclass
class _Reader:
    tables: dict[TableName, CaptureTable]
    applier: Applier
    batch_changes: int
    advance: Callable[[Read], None]
    span: tuple[int, int]  # the WAL the drain reads: where it starts, where it ends
    read: Read = field(default_factory=Read)
    # the batch being read is handed over at a commit past this many changes (see above)
    size: int = field(init=False)
    batch: Batch = field(default_factory=Batch)
    # each relation's table, and how the log's shape of it differs from the copy's
    relations: dict[int, tuple[CaptureTable, str | Relation | None]] = field(default_factory=dict)
    final_lsn: int = 0  # the commit position of the transaction being read
    seq: int = 0
    # each relation's taker (or None) in the transaction being read: asked once per
    # transaction, not per change; forgotten at its Begin and at a Relation message
    takers: dict[bytes, CaptureTable | None] = field(default_factory=dict)
    # where the transaction being read is cut into a part (applier.submit_part): only one
    # of batch_changes changes or more is, so that its apply overlaps its own decoding
    part_at: int = 1 << 62
    history: bool = field(init=False)  # a table keeps history: each Begin is kept

    def __post_init__(self) -> None:
        self.size = max(1, self.batch_changes // RAMP)
        self.history = any(t.history is not None for t in self.tables.values())


def read_changes(
    chunks: Iterable[list[bytes]],
    applier: Applier,
    tables: dict[TableName, CaptureTable],
    batch_changes: int,
    advance: Callable[[Read], None],
    span: tuple[int, int],
) -> Read:
    """Apply the messages of `chunks` (lists of them: whole transactions, the WAL of
    `span`), batch by batch; returns once every batch is applied. `advance` is called, on
    this thread, each time `Read.applied` moves."""
    reader = _Reader(tables, applier, batch_changes, advance, span)
    read, stager = reader.read, applier.stager
    stages: dict[bytes, TableStage] = {}  # the batch's staging table of each relation
    takers = reader.takers
    for chunk in chunks:
        for data in chunk:
            if data[0] in _ROW_CHANGES:  # the hot path: no message object
                reader.batch.changes += 1
                if reader.batch.changes >= reader.part_at:
                    _hand_over_part(reader)
                relation = data[1:5]  # its OID, as bytes: as good a key as the number, cheaper
                table = takers.get(relation, _UNKNOWN)
                if table is _UNKNOWN:
                    known = reader.relations.get(int.from_bytes(relation, "big"))
                    table = takers[relation] = _taker(reader, known)
                if table is not None:
                    stage = stages.get(relation)
                    if stage is None:
                        stage = stages[relation] = _stage_of(stager, table)
                    seq = reader.seq = reader.seq + 2
                    if table.shape is None:  # rows made at the flush, many at once
                        stager.add_raw(stage, data, seq)
                    else:
                        _stage_change(stager, stage, table, data, seq)
            elif _other(reader, stager, data):  # a commit closed a full batch
                stager = applier.stager
                stages.clear()
    _hand_over(reader)
    read.hold_at(applier.wait())
    return read


def _other(reader: _Reader, stager: Stager, data: bytes) -> bool:
    """A message other than a row change; True when it handed a full batch to the applier."""
    message = decode(data, raw=True)
    if isinstance(message, Begin | Relation):
        reader.takers.clear()
    if isinstance(message, Begin):
        reader.final_lsn = message.final_lsn
        reader.part_at = reader.batch.changes + reader.size
        if reader.history:  # its changes come after this seq (cdc/apply/history_apply.py)
            reader.batch.transactions.append((reader.seq, message.committed_at))
    elif isinstance(message, Commit):
        reader.batch.end = reader.read.end = message.end_lsn
        # a batch applied in parts closes at its transaction's commit: its destination
        # transaction, open since the first part, stays open no longer than it must
        full = reader.batch.changes >= reader.size or stager.part_open
        if full or _near_the_end(reader):
            _hand_over(reader)
            return True
    elif isinstance(message, Relation):
        table = reader.tables.get(TableName(message.schema, message.name))
        if table is not None:
            reader.relations[message.oid] = (table, _drift(table, message))
    elif isinstance(message, Truncate):
        reader.batch.changes += 1
        for oid in message.relations:
            table = _taker(reader, reader.relations.get(oid))
            if table is not None:
                reader.seq += 2
                stager.truncate(_stage_of(stager, table), reader.seq)
    return False


def _near_the_end(reader: _Reader) -> bool:
    """The batch holds at least as many changes as the rest of the drain is estimated to
    (and a twentieth of a full batch): cut here, so that the last apply, which nothing
    overlaps, is a small one."""
    changes = reader.batch.changes
    if changes < reader.batch_changes // 20:
        return False
    start, end = reader.span
    done, left = reader.batch.end - start, end - reader.batch.end
    return done > 0 and changes * done >= left * (reader.read.changes + changes)


def _hand_over_part(reader: _Reader) -> None:
    """A transaction of more changes than a batch holds: what is staged so far is applied
    now, in a destination transaction left open for the rest of the batch, while the reader
    decodes on (the batch stays on this session; its last part commits it)."""
    _grow(reader)
    reader.part_at += reader.size
    reader.read.hold_at(reader.applier.submit_part(reader.batch, list(reader.tables.values())))
    _applied(reader)


def _hand_over(reader: _Reader) -> None:
    batch = reader.batch
    if batch.changes:
        reader.read.batches += 1
        reader.read.changes += batch.changes
        _grow(reader)
        reader.read.hold_at(reader.applier.submit(batch, list(reader.tables.values())))
        _applied(reader)
    reader.batch = Batch()


def _grow(reader: _Reader) -> None:
    reader.size = min(reader.batch_changes, reader.size * 2)


def _applied(reader: _Reader) -> None:
    """The batches before the one just handed over are applied: the slot may move."""
    if reader.applier.applied_end > reader.read.applied:
        reader.read.applied = reader.applier.applied_end
        reader.advance(reader.read)


def _drift(table: CaptureTable, message: Relation) -> str | Relation | None:
    """How the log's shape of the table differs from its copy's (None: it does not; the
    message itself: a shape a copy that evolves may take in place)."""
    logged = [(c.name, c.type_oid) for c in message.columns]
    if table.built is None:  # only watched: its shape is checked when it is synced
        return None
    named = _named_by(table, message)
    if named is not None:
        return named
    if table.copy_shape is not None:
        return None if table.fits(message.columns) else message
    if table.shaping is not None:  # excluded columns dropped, hashed ones hashed
        shape = table.shaping.for_relation(logged)
        if isinstance(shape, str):
            return shape
        table.shape = shape
        return None
    copied = [(c.name, c.type_oid) for c in table.built.columns]
    return None if logged == copied else _describe_drift(logged, copied)


def _named_by(table: CaptureTable, message: Relation) -> str | None:
    """Why the log's updates and deletes of the table cannot be applied by the copy's key:
    its replica identity when they were written (which the Relation message says) named the
    rows by other columns, say while the identity was switched from FULL and back. None
    when they can: FULL, or an identity whose key is the copy's."""
    if message.replica_identity == "f":
        return None
    logged = sorted(c.name for c in message.columns if c.in_key)
    if logged == sorted(table.key):
        return None
    identity = IDENTITY_NAMES.get(message.replica_identity, message.replica_identity).upper()
    return (
        f"in the log: replica identity {identity} names rows by ({', '.join(logged)}), not by "
        f"the copy's key ({', '.join(table.key)})"
    )


def _describe_drift(logged: list[tuple[str, int]], copied: list[tuple[str, int]]) -> str:
    now, before = dict(logged), dict(copied)
    added = [n for n in now if n not in before]
    dropped = [n for n in before if n not in now]
    retyped = [n for n in now if n in before and now[n] != before[n]]
    parts = [
        *(f"{n} added" for n in added),
        *(f"{n} dropped" for n in dropped),
        *(f"{n} type changed" for n in retyped),
    ]
    return "in the log: " + (", ".join(parts) if parts else "columns reordered")


def _taker(
    reader: _Reader, known: tuple[CaptureTable, str | Relation | None] | None
) -> CaptureTable | None:
    """The table that takes a change of this relation in the transaction being read; None
    when none does (not a cdc table, a change its copy has, a table not selected this run,
    which holds the slot there, or one already failed, drifted or stopped)."""
    final_lsn = reader.final_lsn
    if known is None or final_lsn < known[0].applied:
        return None
    table, drift = known
    if not table.apply or table.holds or table.evolving is not None:  # read again later
        reader.read.hold_at(final_lsn)
        return None
    if isinstance(drift, Relation) and table.drift is None:
        _stop(reader, table, drift)
        return None
    if drift is not None and table.drift is None:
        table.drift = drift  # reloaded after the drain; its changes from here are moot
    if not table.takes_changes:
        return None
    reader.batch.first_seen.setdefault(table.name, final_lsn)
    return table


def _stop(reader: _Reader, table: CaptureTable, message: Relation) -> None:
    """A copy that takes schema changes in place stops before the transaction whose shape
    it does not fit: the commits before are applied, and the slot keeps this one. Unless the
    transaction changed the table before its shape did: the copy has no shape for those
    changes, and reloads."""
    if reader.batch.first_seen.get(table.name) == reader.final_lsn:
        table.drift = "in the log: the shape changed inside a transaction that changed rows"
        return
    table.evolving = message
    table.stop = max(reader.read.end, table.applied)
    reader.read.hold_at(reader.final_lsn)


def _stage_of(stager: Stager, table: CaptureTable) -> TableStage:
    stage = stager.stage_for(table.target, table.columns, table.key_positions)
    stage.one_by_one = functools.partial(_stage_change, stager, stage, table)
    return stage


def _stage_change(
    stager: Stager, stage: TableStage, table: CaptureTable, data: bytes, seq: int
) -> None:
    if stager.binary:  # never shaped (drain.binary_values)
        kind, old, old_is_key, new = binary_change(data)
    else:
        if table.shape is None:
            plain = plain_line(data, seq)
            if plain is not None:
                stager.add_plain(stage, plain, data[0] == UPDATE)
                return
        kind, old, old_is_key, new = change(data)
    if table.shape is not None:
        old, new = table.shape.apply(old), table.shape.apply(new)
    if kind == INSERT:
        stager.add(stage, seq, b"I", new)
    elif kind == DELETE:
        stager.add(stage, seq, b"D", old)
    elif old is None:
        stager.add(stage, seq, b"U", new)
    else:
        _stage_update(stager, stage, table, seq, old, old_is_key, new)


def _stage_update(
    stager: Stager,
    stage: TableStage,
    table: CaptureTable,
    seq: int,
    old: list[Any],
    old_is_key: bool,
    new: list[Any],
) -> None:
    """An update that carries its old row: REPLICA IDENTITY FULL (unchanged values come from
    it), or a key that changed (the row leaves its old key: a delete there)."""
    if not old_is_key:
        new = [o if n is UNCHANGED else n for n, o in zip(new, old, strict=True)]
    positions = table.key_positions
    if [old[i] for i in positions] == [new[i] for i in positions]:
        stager.add(stage, seq, b"U", new)
        return
    stager.add(stage, seq - 1, b"D", old)
    if UNCHANGED in new:  # values of the old key's row (at seq - 1): resolved when applied
        stage.moves.append(seq)
        stager.add(stage, seq, b"M", new)
    else:
        stager.add(stage, seq, b"U", new)
