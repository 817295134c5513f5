"""The statements each action runs, built from what the databases look like: one builder per
part of an action, which `sync` runs and `compile` prints (docs/architecture.md).

A builder is pure: the reads it depends on (which schemas are missing, the types to create or
align) are gathered first, into `DestinationFacts`; values known only while a run goes on
(the load id, the snapshot, a task's row count) are bound parameters or placeholders.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import psycopg
from psycopg import sql

from ..base.identifiers import INTERNAL_SCHEMA, TableName
from ..plan.table_sql import TableSql
from ..postgres import ddl
from ..postgres.copy_objects import CopyIndex
from ..postgres.database import Step
from ..postgres.dest_schema import bookkeeping_steps, missing_objects, schema_steps
from ..postgres.history_tables import batch_steps
from ..postgres.naming import derived_name, retired_table, staging_table, staging_tables
from ..postgres.ownership import record_owned_steps
from ..postgres.types.dest_types import type_work
from ..transfer.copy_stream import SOURCE_BEGIN
from ..transfer.copy_tasks import copy_tasks
from ..transfer.markers import forget_loads_step, forget_markers_step

MAINTENANCE_WORK_MEM = "512MB"


@dataclass(frozen=True)
class DestinationFacts:
    """What an action's statements depend on in the destination."""

    missing: tuple[str, ...]  # schemas to create: the table's, its types', `_replicator`
    types: tuple[Step, ...]  # the table's user-defined types, created or aligned
    bookkeeping: tuple[TableName, ...] | None = None  # missing ones (None: not looked for)

    @classmethod
    def read(
        cls,
        source: psycopg.Connection[Any],
        dest: psycopg.Connection[Any],
        built: TableSql,
        *,
        types: bool = True,
    ) -> DestinationFacts:
        """Reads both catalogs, writes nothing (TableProblem when a type cannot be aligned).
        Without `types` (an incremental batch, which creates no type), only `_replicator`
        is looked for."""
        if not types:
            schemas, tables = missing_objects(dest, [INTERNAL_SCHEMA])
            return cls(tuple(schemas), (), tuple(tables))
        work = type_work(source, dest, built.columns)
        wanted = [built.table.target.schema, *work.schemas, INTERNAL_SCHEMA]
        schemas, tables = missing_objects(dest, wanted)
        return cls(tuple(schemas), tuple(work.steps), tuple(tables))

    @property
    def user_schemas(self) -> list[str]:
        return [s for s in self.missing if s != INTERNAL_SCHEMA]


def side_table(target: TableName) -> TableName:
    """Where a full reload of `target` is loaded before the swap."""
    return TableName(INTERNAL_SCHEMA, derived_name("new", target))


def side_key_name(built: TableSql) -> str | None:
    """The side table's primary-key name while it is built; the swap renames it."""
    return derived_name("pk", built.table.target) if built.primary_key else None


def _destination(statement: Any, params: Any = None) -> Step:
    return Step("destination", statement, params)


# ---------------------------------------------------------------- full reload


def prepare_steps(
    built: TableSql, facts: DestinationFacts, *, keep_side: bool = False
) -> list[Step]:
    """Schemas, bookkeeping, types, and a fresh side table without its key (building the key
    after the load measured faster than maintaining it: bench/RESULTS.md). What a killed run
    left is dropped first: a stale side table, and a replaced table the swap renamed aside
    but did not drop yet. `keep_side`: a resumed load keeps its partly loaded side table."""
    target = built.table.target
    side = side_table(target)
    fresh_side = [
        _destination(ddl.drop_table(side)),
        _destination(ddl.create_table(side, built.destination_columns)),
    ]
    key = side_key_name(built)
    # A resumed load killed after its key was built (before its swap) builds it again.
    kept_side = (
        [
            _destination(
                sql.SQL("ALTER TABLE {} DROP CONSTRAINT IF EXISTS {}").format(
                    side.identifier(), sql.Identifier(key)
                )
            )
        ]
        if key
        else []
    )
    return [
        *schema_steps(facts.user_schemas),
        *bookkeeping_steps(facts.missing, facts.bookkeeping),
        *facts.types,
        _destination(ddl.drop_table(retired_table(target))),
        # an incremental run killed after creating its staging table, whose next actions
        # were this reload and no-ops, would leave it behind for good
        *(_destination(ddl.drop_table(table)) for table in staging_tables(target)),
        *(kept_side if keep_side else fresh_side),
    ]


def key_steps(built: TableSql, indexes: Sequence[CopyIndex] = ()) -> list[Step]:
    """The loaded side table's primary key, the copy's other indexes (copy_objects.py) and
    statistics, before readers see it. A bigger sort budget lets PostgreSQL build each index
    in memory, with parallel workers."""
    target = built.table.target
    side = side_table(target)
    budget = sql.SQL("SET maintenance_work_mem = {}").format(sql.Literal(MAINTENANCE_WORK_MEM))
    steps = [_destination(budget)]
    key = key_statement(built)
    if key is not None:
        steps.append(_destination(key))
    for index in indexes:
        steps += index.build(side, target)
    return [
        *steps,
        _destination(sql.SQL("ANALYZE {}").format(side.identifier())),
        _destination("RESET maintenance_work_mem"),
    ]


def key_statement(built: TableSql) -> sql.Composable | None:
    """The primary key, built on the loaded side table."""
    name = side_key_name(built)
    if name is None:
        return None
    return sql.SQL("ALTER TABLE {} ADD CONSTRAINT {} PRIMARY KEY ({})").format(
        side_table(built.table.target).identifier(),
        sql.Identifier(name),
        sql.SQL(", ").join(map(sql.Identifier, built.primary_key)),
    )


def start_load_steps(target: TableName) -> list[Step]:
    """Before a load's tasks: the markers earlier loads of the table left are dropped."""
    return [forget_loads_step(target)]


def end_load_steps(load_id: str) -> list[Step]:
    """After a load committed: its own markers are no longer needed."""
    return [forget_markers_step(load_id)]


# ---------------------------------------------------------------- incremental


def staging_steps(built: TableSql, facts: DestinationFacts, parts: int = 1) -> list[Step]:
    """Empty UNLOGGED staging tables for the batch, one per part
    (sync/incremental/merge_pipeline.py); a killed run's are dropped first, with a replaced
    table a killed swap left aside."""
    target = built.table.target
    return [
        *bookkeeping_steps(facts.missing, facts.bookkeeping),
        _destination(ddl.drop_tables([retired_table(target), *staging_tables(target)])),
        *(
            _destination(ddl.create_table(table, built.columns, unlogged=True))
            for table in staging_tables(target, parts)
        ),
    ]


# A batch merged in parts (sync/incremental/merge_pipeline.py): its transaction must see each part
# committed after it began, whatever isolation the server defaults to, and must not be ended
# by the server's idle timeout while the next part copies.
PARTS_BEGIN = "BEGIN ISOLATION LEVEL READ COMMITTED"
PARTS_NEVER_IDLE_OUT = "SET LOCAL idle_in_transaction_session_timeout = 0"


def merge_steps(built: TableSql, merged: int = 1, staged: int = 1) -> list[Step]:
    """The merge macro in one destination transaction, once for each of the first `merged`
    staging tables (a batch in parts: sync/incremental/merge_pipeline.py), then the `staged` ones
    dropped."""
    tables = staging_tables(built.table.target, merged)
    merges = [built.merge_from(table) for table in tables]
    begin = [PARTS_BEGIN, PARTS_NEVER_IDLE_OUT] if merged > 1 else ["BEGIN"]
    history = []  # a table with history is never staged in parts (merge_pipeline.part_rows)
    if built.history is not None:
        history = batch_steps(
            built.history,
            tables[0].identifier(),
            SNAPSHOT_TIME,
            built.table.replication_key,
            built.replication_key_type,
            append=built.table.mode == "incremental-append",
        ).steps
    return [
        *map(_destination, begin),
        *(_destination(merge) for merge in merges if merge is not None),
        *history,
        _destination("COMMIT"),
        *drop_staging_steps(built, max(staged, merged)),
    ]


# What `compile` shows for the time of a snapshot a run takes (a history's versions begin then)
SNAPSHOT_TIME = "<snapshot time>"


# A batch staged in a temporary table: the session's own schema, whatever its number.
TEMPORARY_SCHEMA = "pg_temp"


@dataclass(frozen=True)
class DirectBatch:
    """The statements of a batch this process copies whole on the run's own two sessions
    (sync/incremental/direct_batch.py), each kept apart for the sync to run in its place.
    `steps` is the order they run in, as `compile` prints it; the reads between them (the
    open transactions, the newest key, the new cursor's fingerprint) are not part of it."""

    drop: Step | None  # what a killed run of the general way left (the run's read ahead)
    create: Step  # the temporary staging table, dropped as the merge's transaction ends
    copy_in: Step
    copy_out: Step
    merge: Step
    staging: TableName  # the temporary table, as the merge and the checks name it
    origin: str  # the model the rows come from, for a copy's errors
    # a table with history: its versions, after the merge (sync binds the snapshot's time)
    history: list[Step] = field(default_factory=list)

    @property
    def steps(self) -> list[Step]:
        return [
            *([self.drop] if self.drop is not None else []),
            _destination("BEGIN"),
            self.create,
            Step("source", SOURCE_BEGIN),
            self.copy_in,
            self.copy_out,
            Step("source", "ROLLBACK"),
            self.merge,
            *self.history,
            _destination("COMMIT"),
        ]


def direct_batch(
    built: TableSql, query: sql.Composable, leftovers: Iterable[TableName]
) -> DirectBatch:
    """A batch's statements when this process copies it whole (`query`: its rows)."""
    target = built.table.target
    staging = TableName(TEMPORARY_SCHEMA, staging_table(target).name)
    (task,) = copy_tasks(
        "", "", "", "", [query], (staging.schema, staging.name), [c.name for c in built.columns]
    )
    merge = built.merge_from(staging)
    assert merge is not None
    history = []
    if built.history is not None:  # sync binds the time its source transaction began
        history = batch_steps(
            built.history,
            staging.identifier(),
            SNAPSHOT_TIME,
            built.table.replication_key,
            built.replication_key_type,
            append=built.table.mode == "incremental-append",
        ).steps
    left = set(leftovers)
    gone = [t for t in (retired_table(target), *staging_tables(target)) if t in left]
    return DirectBatch(
        drop=_destination(ddl.drop_tables(gone)) if gone else None,
        create=_destination(ddl.create_temporary_table(staging.name, built.columns)),
        copy_in=_destination(task.copy_in),
        copy_out=Step("source", task.copy_out),
        merge=_destination(merge),
        staging=staging,
        origin=built.model.origin,
        history=history,
    )


def drop_staging_steps(built: TableSql, parts: int = 1) -> list[Step]:
    return [_destination(ddl.drop_tables(staging_tables(built.table.target, parts)))]


# ---------------------------------------------------------------- start without backfill


def applied_steps(target: TableName, position: int | str | None) -> list[Step]:
    """A cdc table's log position, recorded beside it; the log's modules are imported for
    such a table only (a cursor run never loads them)."""
    if position is None:
        return []
    from ..cdc.apply.applied import record_applied_step

    return [record_applied_step(target, position)]


def start_steps(
    built: TableSql, facts: DestinationFacts, exists: bool, position: str | None = None
) -> list[Step]:
    """initial_load skip: create the destination table (schema and types first) unless it
    exists, and record it as the tool's, in one transaction; for a `cdc` table, with its
    log `position` (the copy and its position never disagree)."""
    create = (
        []
        if exists
        else [
            *schema_steps(facts.user_schemas),
            *facts.types,
            _destination(built.create_destination),
        ]
    )
    return [
        *bookkeeping_steps(facts.missing, facts.bookkeeping),
        _destination("BEGIN"),
        *create,
        *record_owned_steps(built.table.target),
        *applied_steps(built.table.target, position),
        _destination("COMMIT"),
    ]
