"""One run's reading of the slot: every change committed before the run started, in bounded
batches, each applied and recorded before the slot lets go of it.

A batch is what `pg_logical_slot_peek_binary_changes` returns from the slot's position, up to
the WAL flushed when the run began, stopping at the first commit after BATCH_CHANGES messages
(a bigger transaction comes whole, but streams through a server-side cursor into COPY, so
memory stays bounded). Per batch:
1. decode and stage each table's changes (a table skips transactions whose commit starts
   before its applied position: they are in its copy already);
2. apply each table in its own destination transaction, which records the position;
3. advance the slot to the batch's end, or only up to the first transaction a table could not
   take (it failed, drifted... or was not selected this run): that table reads it again next
   run, and the tables that took it skip it by their positions.
A crash between 2 and 3 re-reads the batch next run and applies nothing twice.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import psycopg

from ..errors import ReplicatorError, one_line
from ..failpoints import failpoint
from ..identifiers import TableName
from ..interrupts import raise_if_requested
from ..plan.table_sql import TableSql
from ..postgres.database import connect, execute, note
from .applied import forget_applied
from .apply import apply_stage
from .copy_rows import DELETE, INSERT, UPDATE, Field, change, relation_of
from .lsn import lsn_text
from .pgoutput import UNCHANGED, Begin, Commit, Relation, Truncate, Update, decode
from .slot import advance_slot
from .stage import Stager, TableStage

log = logging.getLogger("replicator.capture")

BATCH_CHANGES = 200_000
FETCH_ROWS = 5_000


@dataclass
class CaptureTable:
    """A `cdc` table the drain feeds (or only watches, `apply` False: not selected this run)."""

    name: TableName  # the source table, as the log names it
    built: TableSql | None  # None for a table only watched
    applied: int  # commits starting before this are in the destination already
    apply: bool = True
    # what this drain did to it
    changes: int = 0
    upserted: int = 0
    deleted: int = 0
    truncated: bool = False
    drift: str | None = None  # the log's shape of the table differs from the copy's
    error: str | None = None
    holds: bool = False  # failed, and its position could not be forgotten: keeps its changes
    position: int = 0  # where its copy is current to after the drain
    key_positions: tuple[int, ...] = field(default=())

    def __post_init__(self) -> None:
        names = list(self.columns)
        key = self.built.primary_key if self.built else ()
        self.key_positions = tuple(names.index(k) for k in key)
        self.position = self.applied

    @functools.cached_property
    def columns(self) -> tuple[str, ...]:
        return tuple(c.name for c in self.built.columns) if self.built else ()

    @property
    def target(self) -> TableName:
        assert self.built is not None
        return self.built.table.target

    @property
    def key(self) -> tuple[str, ...]:
        assert self.built is not None
        return self.built.primary_key

    @property
    def label(self) -> str:
        return self.built.table.written_name if self.built else str(self.name)

    @property
    def takes_changes(self) -> bool:
        return self.apply and self.drift is None and self.error is None


@dataclass
class DrainResult:
    tables: list[CaptureTable]
    start: int
    end: int  # the slot's position after the drain
    batches: int


def drain(
    source_url: str,
    dest_url: str,
    slot: str,
    publication: str,
    tables: Sequence[CaptureTable],
    start: int,
    upto: int,
    *,
    batch_changes: int | None = None,
) -> DrainResult:
    """Read, apply and release the slot's changes from `start` (its position) up to `upto`
    (the WAL flushed when the run began)."""
    by_name = {t.name: t for t in tables}
    position, batches = start, 0
    with (
        connect(source_url, "source", autocommit=False) as source,
        connect(dest_url, "destination") as dest,
    ):
        (encoding,) = execute(source, "SHOW server_encoding").fetchone()
        source.commit()
        execute(dest, "SELECT set_config('client_encoding', %s, false)", (encoding,))
        stager = Stager(dest)
        limit = batch_changes or BATCH_CHANGES
        while True:
            raise_if_requested()
            batch = _read_batch(source, stager, slot, publication, by_name, upto, limit)
            if batch.rows:
                batches += 1
                position = _finish_batch(source, dest, stager, slot, tables, batch, position)
            if batch.hold is not None:
                if batch.rows < limit:  # read up to `upto`; the held part waits for its table
                    break
                # The slot cannot pass the held change: read further from it, the tables
                # skipping what they already applied (each read starts at the slot).
                limit *= 2
                continue
            if batch.rows < limit:  # the slot is read up to `upto`
                if upto > position:
                    advance_slot(source, slot, upto)
                    source.commit()
                    position = upto
                break
    for table in tables:
        if table.takes_changes:
            table.position = max(table.position, position)
    return DrainResult(list(tables), start, position, batches)


def _finish_batch(
    source: psycopg.Connection[Any],
    dest: psycopg.Connection[Any],
    stager: Stager,
    slot: str,
    tables: Sequence[CaptureTable],
    batch: _Batch,
    position: int,
) -> int:
    """Apply the staged batch table by table, then advance the slot as far as every table
    took it; returns the slot's new position."""
    failpoint("cdc-after-stage")
    for table in tables:
        if not table.takes_changes:
            continue
        stage = stager.stages.get(table.target)
        if stage is not None and stage.changes:
            _apply(dest, table, stage, batch)
    failpoint("cdc-after-apply-before-advance")
    target = batch.end if batch.hold is None else min(batch.hold, batch.end)
    if target > position:
        advance_slot(source, slot, target)
        source.commit()
        position = target
    stager.reset()
    log.debug(
        "cdc: batch of %d message(s), %d change(s), up to %s",
        batch.rows,
        batch.changes,
        lsn_text(batch.end),
    )
    return position


@dataclass
class _Batch:
    rows: int = 0
    changes: int = 0
    end: int = 0  # the end of its last commit
    hold: int | None = None  # the first commit a watched-only table has changes in
    first_seen: dict[TableName, int] = field(default_factory=dict)

    def hold_at(self, lsn: int) -> None:
        self.hold = lsn if self.hold is None else min(self.hold, lsn)


def _read_batch(
    source: psycopg.Connection[Any],
    stager: Stager,
    slot: str,
    publication: str,
    tables: dict[TableName, CaptureTable],
    upto: int,
    limit: int,
) -> _Batch:
    batch = _Batch()
    relations: dict[int, tuple[CaptureTable, str | None]] = {}
    final_lsn = 0  # the commit position of the transaction being read
    seq = 0
    statement = (
        "SELECT data FROM pg_catalog.pg_logical_slot_peek_binary_changes(%s, %s::pg_lsn, %s, "
        "'proto_version', '1', 'publication_names', %s)"
    )
    note(source, statement)
    with source.cursor(name="replicator_changes", binary=True) as cursor:
        cursor.itersize = FETCH_ROWS
        cursor.execute(statement, (slot, lsn_text(upto), limit, _quote_publication(publication)))
        for (data,) in cursor:
            batch.rows += 1
            kind = data[0]
            if kind in _ROW_CHANGES:  # the hot path: no message object
                batch.changes += 1
                known = relations.get(relation_of(data))
                table = _taker(known, final_lsn, batch)
                if table is not None:
                    seq += 2
                    _stage_change(stager, table, data, seq)
                continue
            message = decode(data, raw=True)
            if isinstance(message, Begin):
                final_lsn = message.final_lsn
            elif isinstance(message, Commit):
                batch.end = message.end_lsn
            elif isinstance(message, Relation):
                table = tables.get(TableName(message.schema, message.name))
                if table is not None:
                    relations[message.oid] = (table, _drift(table, message))
            elif isinstance(message, Truncate):
                batch.changes += 1
                for oid in message.relations:
                    table = _taker(relations.get(oid), final_lsn, batch)
                    if table is not None:
                        seq += 2
                        stage = stager.stage_for(table.target, table.columns, table.key_positions)
                        stager.truncate(stage, seq)
    source.commit()
    stager.flush()
    return batch


_ROW_CHANGES = frozenset((INSERT, UPDATE, DELETE))


def _quote_publication(name: str) -> str:
    """publication_names is a comma-separated list of identifiers: quote ours."""
    return '"' + name.replace('"', '""') + '"'


def _drift(table: CaptureTable, message: Relation) -> str | None:
    """How the log's shape of the table differs from its copy's (None: it does not)."""
    logged = [(c.name, c.type_oid) for c in message.columns]
    if table.built is None:  # only watched: its shape is checked when it is synced
        return None
    copied = [(c.name, c.type_oid) for c in table.built.columns]
    return None if logged == copied else _describe_drift(logged, copied)


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
    known: tuple[CaptureTable, str | None] | None, final_lsn: int, batch: _Batch
) -> CaptureTable | None:
    """The table that takes a change of this relation in the transaction committing at
    `final_lsn`; None when none does (not a cdc table, a change its copy has, a table not
    selected this run, which holds the slot there, or one already failed or drifted)."""
    if known is None or final_lsn < known[0].applied:
        return None
    table, drift = known
    if not table.apply or table.holds:  # it reads this again next time
        batch.hold_at(final_lsn)
        return None
    if drift is not None and table.drift is None:
        table.drift = drift  # reloaded after the drain; its changes from here are moot
    if not table.takes_changes:
        return None
    if table.name not in batch.first_seen:
        batch.first_seen[table.name] = final_lsn
    return table


def _stage_change(stager: Stager, table: CaptureTable, data: bytes, seq: int) -> None:
    stage = stager.stage_for(table.target, table.columns, table.key_positions)
    kind, old, old_is_key, new = change(data)
    if kind == INSERT:
        stager.add(stage, seq, b"I", new)
    elif kind == DELETE:
        stager.add(stage, seq, b"D", old)
    elif old is None:
        stager.add(stage, seq, b"U", new)
    else:
        _stage_update(stager, stage, table, data, seq, old, old_is_key, new)


def _stage_update(
    stager: Stager,
    stage: TableStage,
    table: CaptureTable,
    data: bytes,
    seq: int,
    old: list[Field],
    old_is_key: bool,
    new: list[Field],
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
    if UNCHANGED in new:  # values of the old key's row: resolved when applied
        message = decode(data, raw=True)
        assert isinstance(message, Update) and message.old is not None
        stage.moves.append((seq, tuple(message.old[i] for i in positions)))  # type: ignore[misc]
        stager.add(stage, seq, b"M", new)
    else:
        stager.add(stage, seq, b"U", new)


def _apply(
    dest: psycopg.Connection[Any], table: CaptureTable, stage: TableStage, batch: _Batch
) -> None:
    """Apply one table's batch. On failure its position is forgotten, so that its next run
    reloads it and the others go on; if even that fails, it holds the slot at its first
    change."""
    started, end = time.monotonic(), batch.end
    try:
        applied = apply_stage(dest, stage, table.key, end, table.label)
    except (ReplicatorError, psycopg.Error) as exc:
        raise_if_requested()
        table.error = one_line(exc)
        try:  # its next run reloads it; meanwhile the slot need not keep its changes
            forget_applied(dest, table.target)
        except (ReplicatorError, psycopg.Error):
            table.holds = True
            batch.hold_at(batch.first_seen.get(table.name, end))
        return
    table.changes += stage.changes
    table.upserted += applied.upserted
    table.deleted += applied.deleted
    table.truncated = table.truncated or applied.truncated
    table.applied = table.position = end
    log.debug(
        "cdc: %s: %d change(s) applied in %.2f s",
        table.label,
        stage.changes,
        time.monotonic() - started,
    )
