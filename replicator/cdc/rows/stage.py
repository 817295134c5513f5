"""Decoded changes into per-table staging tables in the destination, with COPY.

Each `cdc` table gets a temporary table shaped like its destination table, plus the change's
place in the batch (`_replicator_seq`, commit order), its kind (`_replicator_op`: I insert,
U update, D delete, M an update that moved the row to a new key) and the columns whose
TOASTed value the change left as it was (`_replicator_unchanged`, 1-based positions; the
value is then NULL here and comes from the row's previous version when applied).

pgoutput sends values in the type's text output, which is what COPY's text format reads, so
values are never parsed here: bytes are escaped and passed on. When the drain asks for
binary values (cdc/rows/binary_values.py), they go on as they came, in COPY's binary format.
A table's changes wait as the log sent them until the flush, which turns a thousand or more
into rows at once (cdc/rows/copy_block.py) and the rest one by one (cdc/rows/copy_rows.py,
through the reader).
Rows are buffered per table and flushed with one COPY per table whenever the buffers pass
FLUSH_BYTES (on a copier thread, while the next rows are decoded; one COPY at a time): memory
stays bounded whatever the size of a transaction (while the session applies a part of a
transaction bigger than a batch, rows wait in memory, up to PART_HELD_BYTES). Temporary
tables write no WAL and vanish with the session, so a crash leaves nothing behind.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import psycopg
from psycopg import sql

from ...base.identifiers import TableName
from ...postgres.database import execute, note
from ...postgres.types.key_equality import key_equality
from ...postgres.types.type_closure import staged_base
from ..source.pgoutput import UNCHANGED
from .binary_rows import HEADER, TRAILER
from .binary_rows import row as binary_row
from .copy_rows import NULL
from .table_stage import OP, SEQ, UNCHANGED_COLUMNS, TableStage

if TYPE_CHECKING:
    from ..capture_table import CaptureTable

FLUSH_BYTES = 8 << 20
# while a part of a big transaction is applied on the session, rows wait in memory up to this
PART_HELD_BYTES = 64 << 20
# a flush with fewer raw changes for a table stages them one by one (no numpy to load)
BLOCK_MIN = 1_000
_BLOCK_NULL = sql.SQL(" (NULL '')")
_BINARY = sql.SQL(" (FORMAT binary)")
# a COPY to run: the staging table, its columns, the rows, the statement's options
_Copy = tuple[sql.Identifier, tuple[str, ...], bytes, sql.SQL | None]


PING_EVERY_S = 10.0


def wait_for(future: Future[Any], ping: Callable[[], None] | None) -> None:
    """Wait for `future`, calling `ping` every PING_EVERY_S meanwhile: the log stream's
    status update, so that the source does not take a reader waiting for a long apply for a
    dead one (its wal_sender_timeout)."""
    while not wait([future], timeout=PING_EVERY_S).done:
        if ping is not None:
            ping()


class Stager:
    """Stages changes for the tables of one drain, on the drain's own destination session."""

    def __init__(
        self,
        dest: psycopg.Connection[Any],
        copier: ThreadPoolExecutor | None = None,
        *,
        binary: bool = False,
    ) -> None:
        self.dest = dest
        self.stages: dict[TableName, TableStage] = {}
        self.buffered = 0
        self._copier = copier  # sends full buffers while the next ones are filled
        self._copying: Future[None] | None = None
        # the applier's work on this session; while a part of a batch is applied here
        # (`part_open`), rows stay in the buffers until the next part or the batch's end
        self.applying: Future[int | None] | None = None
        self.part_open = False
        self.parted: list[CaptureTable] = []  # what the batch's parts applied (applier's)
        self.ping: Callable[[], None] | None = None  # while waiting (see `wait_for`)
        self._blocking = False  # turning raw changes into rows (`_rows_of_raw`)
        self._made = 0  # of `buffered`, the bytes whose rows are made (while a part applies)
        self.binary = binary  # binary values (binary_rows.py): rows in COPY's binary format

    def settle(self) -> None:
        """Wait for the COPY under way (the session runs one statement at a time)."""
        copying, self._copying = self._copying, None
        if copying is not None:
            copying.result()

    def stage_for(
        self, target: TableName, columns: tuple[str, ...], key_positions: tuple[int, ...]
    ) -> TableStage:
        stage = self.stages.get(target)
        if stage is None:
            self.settle()
            self._wait_for_part()  # the session runs one statement at a time
            name = sql.Identifier(f"replicator_stage_{len(self.stages)}")
            execute(
                self.dest,
                sql.SQL(
                    "CREATE TEMP TABLE {stage} AS SELECT 0::bigint AS {seq}, "
                    "'x'::\"char\" AS {op}, '{{}}'::int2[] AS {unchanged}, t.* "
                    "FROM {target} AS t WITH NO DATA"
                ).format(
                    stage=name,
                    seq=sql.Identifier(SEQ),
                    op=sql.Identifier(OP),
                    unchanged=sql.Identifier(UNCHANGED_COLUMNS),
                    target=target.identifier(),
                ),
            )
            undomained = self._undomain(name)
            execute(  # rows made at once leave the column out (cdc/rows/copy_block.py)
                self.dest,
                sql.SQL("ALTER TABLE {} ALTER COLUMN {} SET DEFAULT '{{}}'").format(
                    name, sql.Identifier(UNCHANGED_COLUMNS)
                ),
            )
            stage = TableStage(
                target,
                columns,
                name,
                key_positions=key_positions,
                undomained=undomained,
                equals=key_equality(self.dest, target, [columns[i] for i in key_positions]),
            )
            self.stages[target] = stage
        return stage

    def _undomain(self, name: sql.Identifier) -> dict[str, str]:
        """Domain columns take their base type here: a NOT NULL or CHECK domain would refuse
        the NULLs that stand for values a delete or an unchanged TOASTed value does not carry
        (the destination table checks them when the rows are applied). Returns each such
        column's base type (type_closure.staged_base, which compile shows too)."""
        domains = execute(
            self.dest,
            "SELECT a.attname, a.atttypid FROM pg_catalog.pg_attribute a "
            "JOIN pg_catalog.pg_type t ON t.oid = a.atttypid "
            "WHERE a.attrelid = %s::regclass AND a.attnum > 0 AND NOT a.attisdropped "
            "AND t.typtype = 'd'",
            (name.as_string(self.dest),),
        ).fetchall()
        undomained = {column: str(staged_base(self.dest, oid)) for column, oid in domains}
        if undomained:
            execute(
                self.dest,
                sql.SQL("ALTER TABLE {} {}").format(
                    name,
                    sql.SQL(", ").join(
                        sql.SQL("ALTER COLUMN {} TYPE {}").format(
                            sql.Identifier(column), sql.SQL(base)
                        )
                        for column, base in undomained.items()
                    ),
                ),
            )
        return undomained

    def add(self, stage: TableStage, seq: int, op: bytes, values: list[Any]) -> None:
        """One change; `values` COPY text fields (copy_rows.fields), or UNCHANGED; with
        `binary`, binary values (binary_rows.fields)."""
        if stage.simple:
            stage.note_key(values)
        if op == b"U":
            stage.updates += 1
        if UNCHANGED in values:
            stage.simple = False
            if op == b"I":
                stage.incomplete_insert = seq
        if self.binary:
            line = binary_row(seq, op, values)
        elif UNCHANGED in values:
            unchanged = b",".join(b"%d" % (i + 1) for i, v in enumerate(values) if v is UNCHANGED)
            values = [NULL if v is UNCHANGED else v for v in values]
            line = b"\t".join([b"%d" % seq, op, b"{" + unchanged + b"}", *values])
        else:
            line = b"\t".join([b"%d" % seq, op, b"{}", *values])
        self._buffer(stage, line)

    def add_plain(self, stage: TableStage, fields: list[bytes], update: bool) -> None:
        """A plain change's row (copy_rows.plain_line: one field holding its seq, op and
        unchanged columns, then the values); `update`: its op is U."""
        if stage.simple:
            stage.note_key(fields, 1)
        stage.updates += update
        self._buffer(stage, b"\t".join(fields))

    def add_raw(self, stage: TableStage, data: bytes, seq: int) -> None:
        """One change as the log sent it (an I, U or D message), staged at the next flush."""
        stage.raw.append(data)
        stage.raw_seqs.append(seq)
        self.buffered += len(data)
        if self.buffered >= FLUSH_BYTES:  # (_grew's test first: a call per change is dear)
            self._grew(0)

    def _buffer(self, stage: TableStage, line: bytes) -> None:
        """One row, without its newline (flush puts them between the rows)."""
        stage.buffer.append(line)
        stage.changes += 1
        if not self._blocking:  # (a raw change's bytes are counted already)
            self._grew(len(line) + 1)

    def _grew(self, size: int) -> None:
        self.buffered += size
        if self.buffered >= FLUSH_BYTES:
            if self._part_applying() and self.buffered < PART_HELD_BYTES:
                # the session applies a part: the rows wait here, made ready meanwhile so
                # that the next COPY follows the apply at once
                if self.buffered - self._made >= FLUSH_BYTES:
                    self._make_rows()
                    self._made = self.buffered
                return
            self._wait_for_part()
            self.flush(wait=False)

    def _part_applying(self) -> bool:
        """The applier is applying a part of the batch on this session right now."""
        return self.part_open and self.applying is not None and not self.applying.done()

    def _wait_for_part(self) -> None:
        if self._part_applying():
            assert self.applying is not None
            wait_for(self.applying, self.ping)

    def truncate(self, stage: TableStage, seq: int) -> None:
        if stage.raw:  # its updates are counted before, to be left out
            self._rows_of_raw(stage)
        stage.truncated_at = seq
        stage.truncates.append(seq)
        stage.changes += 1
        stage.updates = 0  # the apply takes only the changes after it

    def flush(self, *, wait: bool = True, taken: list[_Copy] | None = None) -> None:
        """COPY the buffered rows into their staging tables, after `taken` (take_copies'
        earlier); `wait` False: on the copier's thread, while the caller goes on filling
        buffers (the server parses the rows meanwhile)."""
        copies = [*(taken or ()), *self.take_copies()]
        self.settle()
        if copies and self._copier is not None and not wait:
            self._copying = self._copier.submit(self._copy, copies)
        elif copies:
            self._copy(copies)

    def flush_behind(self) -> None:
        """The batch's last flush, rows made from the raw changes included, all on the
        copier's thread: the reader goes on with the next batch on the other session (nothing
        is added to these stages meanwhile); the applier settles it before applying."""
        self.settle()
        if self._copier is None:
            self.flush()
        else:
            self._copying = self._copier.submit(lambda: self._copy(self.take_copies()))

    def take_copies(self) -> list[_Copy]:
        """The buffered rows of each table, as COPYs to run; the buffers start over. Pure
        Python: the reader makes them while the session is busy, then `flush(taken=...)`."""
        self._make_rows()
        copies: list[_Copy] = []
        for stage in self.stages.values():
            if stage.buffer:
                columns = (SEQ, OP, UNCHANGED_COLUMNS, *stage.columns)
                if self.binary:
                    rows = b"".join([HEADER, *stage.buffer, TRAILER])
                    copies.append((stage.name, columns, rows, _BINARY))
                else:
                    copies.append((stage.name, columns, b"\n".join(stage.buffer) + b"\n", None))
            if stage.block_rows and self.binary:
                columns = (SEQ, OP, *stage.columns)
                rows = b"".join([HEADER, *stage.block_rows, TRAILER])
                copies.append((stage.name, columns, rows, _BINARY))
            elif stage.block_rows:  # NULL '': see cdc/rows/copy_block.py
                columns = (SEQ, OP, *stage.columns)
                rows = b"\n".join(stage.block_rows) + b"\n"
                copies.append((stage.name, columns, rows, _BLOCK_NULL))
            stage.buffer.clear()
            stage.block_rows.clear()
        self.buffered = self._made = 0
        return copies

    def _make_rows(self) -> None:
        """Every table's raw changes into rows."""
        for stage in self.stages.values():
            if stage.raw:
                self._rows_of_raw(stage)

    def _rows_of_raw(self, stage: TableStage) -> None:
        """The raw changes of a table into its rows: the plain ones all at once, the others
        (and all of a few) one by one, in any order (their sequence numbers order them)."""
        raw, seqs = stage.raw, stage.raw_seqs
        stage.raw, stage.raw_seqs = [], []
        others: list[int] = list(range(len(raw)))
        if len(raw) >= BLOCK_MIN:  # numpy: loaded for big batches only
            if self.binary:
                from .binary_block import binary_block as block_of
            else:
                from .copy_block import plain_block as block_of

            block = block_of(raw, seqs, len(stage.columns), stage.key_positions)
            if block.rows:
                stage.block_rows.append(block.rows)
                stage.changes += len(block.keys)
                stage.updates += block.updates
                if stage.simple:
                    stage.note_keys(block.keys)
            others = block.others
        assert stage.one_by_one is not None
        self._blocking = True
        try:
            for i in others:
                stage.one_by_one(raw[i], seqs[i])
        finally:
            self._blocking = False

    def _copy(self, copies: list[_Copy]) -> None:
        for name, columns, data, options in copies:
            statement = sql.SQL("COPY {} ({}) FROM STDIN{}").format(
                name,
                sql.SQL(", ").join(sql.Identifier(c) for c in columns),
                options or sql.SQL(""),
            )
            note(self.dest, statement)
            with self.dest.cursor().copy(statement) as copy:
                copy.write(data)

    def reset(self) -> None:
        """Empty every staging table for the next batch."""
        self.settle()
        for stage in self.stages.values():
            stage.buffer.clear()
            stage.block_rows.clear()
            stage.raw, stage.raw_seqs = [], []
            _start_over(stage)
        self.empty_tables()
        self.buffered = self._made = 0

    def take_part(self) -> dict[TableName, TableStage]:
        """What the flushed rows of each table amount to, for the applier, while the reader
        goes on staging the next part of the batch into the same (live) stages."""
        taken = {
            target: replace(
                stage,
                buffer=[],
                block_rows=[],
                keys=set(),
                moves=list(stage.moves),
                truncates=list(stage.truncates),
                raw=[],
                raw_seqs=[],
            )
            for target, stage in self.stages.items()
        }
        for stage in self.stages.values():
            _start_over(stage)
        return taken

    def empty_tables(self, stages: Iterable[TableStage] | None = None) -> None:
        """TRUNCATE the staging tables (of `stages`, else all)."""
        for stage in list(self.stages.values()) if stages is None else stages:
            execute(self.dest, sql.SQL("TRUNCATE {}").format(stage.name))


def _start_over(stage: TableStage) -> None:
    stage.changes = 0
    stage.updates = 0
    stage.truncated_at = None
    stage.truncates = []
    stage.incomplete_insert = None
    stage.moves = []
    stage.keys = set()
    stage.simple = True
