"""One table's staging table as the drain fills it: its unflushed rows and what was staged
into it this batch (cdc/rows/stage.py stages, cdc/apply/table_apply.py applies)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from psycopg import sql

from ...base.identifiers import TableName
from .copy_rows import Field

MAX_KEYS = 500_000  # past this many changes to one table, a batch is deduplicated in SQL
SEQ, OP, UNCHANGED_COLUMNS = "_replicator_seq", "_replicator_op", "_replicator_unchanged"


@dataclass
class TableStage:
    """One table's staging table, its unflushed rows and what was staged this batch."""

    target: TableName
    columns: tuple[str, ...]
    name: sql.Identifier
    buffer: list[bytes] = field(default_factory=list)  # rows without their newline
    block_rows: list[bytes] = field(default_factory=list)  # copy_block's, without `unchanged`
    changes: int = 0
    # the updates (op U) staged after the batch's last TRUNCATE: the count the apply needs
    # of a batch that holds every key once, known without reading the staging table
    updates: int = 0
    truncated_at: int | None = None  # seq of the last TRUNCATE of the table in the batch
    truncates: list[int] = field(default_factory=list)  # every one's, for a history table
    # the seqs of the updates that moved a row to a new key and left TOASTed values as they
    # were (each one's old row is the delete staged just before it, at seq - 1)
    moves: list[int] = field(default_factory=list)
    key_positions: tuple[int, ...] = ()
    keys: set[Field | tuple[Field, ...]] = field(default_factory=set)  # the batch's keys so far
    simple: bool = True  # every key once, no unchanged value: applied without dedup
    # changes kept as the log sent them until the flush turns them into rows all at once
    # (cdc/rows/copy_block.py), with their sequence numbers; `one_by_one` stages one of
    # them the per-message way (set by the reader, which knows the table)
    raw: list[bytes] = field(default_factory=list)
    raw_seqs: list[int] = field(default_factory=list)
    one_by_one: Callable[[bytes, int], None] | None = None
    # the domain columns, staged as their base types (`Stager._undomain`)
    undomained: dict[str, str] = field(default_factory=dict)
    # the key columns whose equality `=` may not find (postgres/types/key_equality.py)
    equals: dict[str, str] = field(default_factory=dict)
    # seq of the batch's last insert that came without a TOASTed value: a row an update
    # moved into the publication's row filter (`where`), which PostgreSQL sends as an insert
    # that leaves the unchanged value out; nothing in the log or the copy holds that value
    incomplete_insert: int | None = None

    def note_key(self, values: list[Field], offset: int = 0) -> None:
        """`values[offset:]` are the row's columns."""
        positions = self.key_positions
        if len(positions) == 1:
            key = values[positions[0] + offset]
        else:
            key = tuple(values[i + offset] for i in positions)
        if key in self.keys or len(self.keys) >= MAX_KEYS:  # memory stays bounded
            self.simple = False
            self.keys.clear()
        else:
            self.keys.add(key)

    def note_keys(self, keys: list[Field | tuple[Field, ...]]) -> None:
        """`note_key` for many rows' keys at once."""
        before = len(self.keys)
        self.keys.update(keys)
        if len(self.keys) < before + len(keys) or len(self.keys) > MAX_KEYS:
            self.simple = False
            self.keys.clear()
