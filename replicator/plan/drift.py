"""What a run observes of a table besides its config and state: its signature now, its
destination table (and whose it is), and how both drifted from the signature stored at the
last load. `plan_now` is the one way sync, compile, status and check decide a table's next
action from that."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import psycopg
from psycopg import sql

from ..base.errors import DatabaseError
from ..base.identifiers import TableName
from ..postgres.catalog import TableInfo, describe_table
from ..postgres.database import execute
from ..postgres.naming import MARK_COLUMN
from ..postgres.ownership import (
    Ownership,
    classify,
    not_owned_fix,
    read_records,
    records_now,
    taken_fix,
)
from ..postgres.partition_tree import holding_rows
from ..project.config import TableConfig
from ..project.state import TableState
from ..project.templates import Templates
from .column_rewrite import rewritten_columns
from .decide import Plan, plan_table
from .evolution import Evolution, evolution
from .inspect_table import inspect_source
from .model_change import ChildTablesChanged, ModelChanged, ShapingChanged, model_change
from .partition_change import PartitionsChanged, behind_cursor, leaf_changes, partitions_change
from .read_ahead import NOTHING_READ, ReadAhead
from .schema_diff import Change, MarkColumnChanged, describe, diff
from .signature import Signature, destination_signature, read_signature
from .table_sql import TableSql, fitting_cursor


@dataclass(frozen=True)
class Observed:
    """What one run saw of a table besides its config and state."""

    signature: Signature
    destination: TableInfo | None
    schema_changes: tuple[Change, ...]  # the source against the stored signature
    destination_changes: tuple[Change, ...]  # the destination table against it
    ownership: Ownership = "missing"  # "missing" also when the destination was not looked at
    # the model's SQL (or its shaping) against the stored ones
    model_changed: ModelChanged | ChildTablesChanged | ShapingChanged | None = None
    # Whether the destination table holds a row now (None: not looked at).
    destination_has_rows: bool | None = None
    # A partitioned table's leaves against the stored ones (partition_change.py).
    partitions_changed: PartitionsChanged | None = None
    # `on_schema_change: "evolve"` and a schema change: how the copy takes it in place
    # (plan/evolution.py), or why it cannot.
    evolution: Evolution | str | None = None
    # `tables[].history`: its history table is gone (dropped by hand), and the copy is there
    history_missing: TableName | None = None
    # its last sync kept no history there (history was off, or in another table)
    history_unkept: bool = False

    @property
    def schema_change(self) -> str | None:
        return describe(list(self.schema_changes)) or None

    @property
    def model_change(self) -> str | None:
        changed = self.model_changed
        return f"{changed.kind}: {changed.detail()}" if changed else None

    @property
    def partitions_change(self) -> str | None:
        return self.partitions_changed.detail() if self.partitions_changed else None

    @property
    def destination_change(self) -> str | None:
        return describe(list(self.destination_changes)) or None


def observe(
    source_conn: psycopg.Connection[Any],
    dest_conn: psycopg.Connection[Any] | None,
    table: TableConfig,
    built: TableSql,
    source: TableInfo,
    state: TableState | None,
    ahead: ReadAhead = NOTHING_READ,
) -> Observed:
    """The source's signature now, the destination table, and how both drifted (the
    destination is not looked at without a connection to it); what `ahead` read is not
    read again."""
    signature = read_signature(source_conn, source, built)
    target = table.target
    known = ahead.destinations is not None and target in ahead.destinations
    destination = None
    if dest_conn is not None:
        destination = ahead.destinations[target] if known else describe_table(dest_conn, target)
    ownership: Ownership = "missing"
    if dest_conn is not None and destination is not None:
        records = ahead.records.get(target) if known else None
        if records is None:
            records = read_records(dest_conn, target, destination.oid)
        ownership = classify(True, records, state)
    schema_changes: list[Change] = []
    destination_changes: list[Change] = []
    changed_model = None
    changed_leaves = None
    has_rows = None
    if dest_conn is not None and destination is not None and table.mode != "full-refresh":
        has_rows = ahead.has_rows.get(target) if known else None
        if has_rows is None:
            has_rows = destination_has_rows(dest_conn, target)
    stored = state.schema_signature if state else None
    if stored and table.mode != "full-refresh":
        before = Signature.from_json(stored)
        schema_changes = diff(before, signature)
        schema_changes += rewritten_columns(before, signature, schema_changes)
        changed_model = model_change(before, signature)
        leaves = leaf_changes(before, signature, log_based=table.mode == "cdc")
        holding: list[TableName] = []
        where = behind_cursor(built, fitting_cursor(built, state.cursor if state else None))
        if leaves.gained:  # what no read of the log or the cursor would bring
            holding = holding_rows(source_conn, source.name, leaves.gained_oids(), where)
        rows = "rows" if where is None else "rows behind the cursor"
        changed_leaves = partitions_change(leaves, holding, rows)
        if isinstance(changed_model, ShapingChanged):
            # The user's own change explains the columns that differ: a reload, never a
            # failure under on_schema_change "fail".
            schema_changes = []
        elif destination is not None:
            has_mark = destination.column(MARK_COLUMN) is not None
            actual = destination_signature(destination)
            if has_mark:  # the metadata column is compared with the config, not the source
                actual = actual.without_column(MARK_COLUMN)
            destination_changes = diff(before.as_created(), actual)
            if has_mark != (table.deletes == "mark"):
                destination_changes.append(MarkColumnChanged(wanted=not has_mark))
    evolving: Evolution | str | None = None
    if schema_changes and table.on_schema_change == "evolve":
        evolving = _evolving(table, built, schema_changes)
    history_missing = None
    history = table.history_table
    if dest_conn is not None and destination is not None and history is not None:
        (found,) = execute(dest_conn, "SELECT to_regclass(%s)", (history.sql(),)).fetchone()
        history_missing = history if found is None else None
    history_unkept = (
        history is not None
        and state is not None
        and state.last_synced_at is not None
        and state.history_table != str(history)
    )
    return Observed(
        signature,
        destination,
        tuple(schema_changes),
        tuple(destination_changes),
        ownership,
        changed_model,
        has_rows,
        changed_leaves,
        evolving,
        history_missing,
        history_unkept,
    )


def _evolving(table: TableConfig, built: TableSql, changes: list[Change]) -> Evolution | str:
    """The changes as the copy takes them in place, or why it cannot."""
    if table.mode == "cdc" and built.shaping is not None:
        return "a cdc table with `columns` or `where` takes a schema change by a reload"
    return evolution(changes)


def destination_has_rows(dest_conn: psycopg.Connection[Any], target: TableName) -> bool:
    """Whether the destination table holds at least one row (reads one, at most)."""
    (found,) = execute(
        dest_conn, sql.SQL("SELECT EXISTS (SELECT FROM {})").format(target.identifier())
    ).fetchone()
    return bool(found)


def destination_oid(dest_conn: psycopg.Connection[Any], target: TableName) -> int | None:
    """The OID of the table now at `target` (after a load's swap: the new one)."""
    (oid,) = execute(dest_conn, "SELECT to_regclass(%s)::oid", (target.sql(),)).fetchone()
    return int(oid) if oid is not None else None


def plan_observed(
    table: TableConfig,
    state: TableState | None,
    observed: Observed,
    full_refresh: bool = False,
    *,
    destination_known: bool = True,
) -> Plan:
    """The table's plan from its config, state and what the run observed (a destination
    that was not looked at counts as present)."""
    return plan_table(
        table.mode or "",
        state,
        full_refresh=full_refresh,
        destination_exists=observed.destination is not None or not destination_known,
        schema_change=observed.schema_change,
        model_change=observed.model_change,
        partitions_change=observed.partitions_change,
        destination_change=observed.destination_change,
        destination_emptied=bool(state and state.holds_rows)
        and observed.destination_has_rows is False,
        destination_replaced=state is not None
        and state.destination_oid is not None
        and observed.destination is not None
        and observed.destination.oid != state.destination_oid,
        on_schema_change=table.on_schema_change or "full_reload",
        cannot_evolve=observed.evolution if isinstance(observed.evolution, str) else None,
        initial_load=table.initial_load,
        not_owned=(
            not_owned_fix(table.target, table.written_name)
            if observed.ownership == "foreign"
            else None
        ),
        taken=(
            taken_fix(table.target, table.written_name) if observed.ownership == "taken" else None
        ),
        name=table.written_name,
        pattern=table.pattern,
        history_gap=(
            f"history table {observed.history_missing} missing"
            if observed.history_missing is not None
            else f"history table {table.history_table} not kept by the last sync"
            if observed.history_unkept
            else None
        ),
    )


@dataclass(frozen=True)
class Planned:
    """A table inspected, observed and planned."""

    source: TableInfo
    built: TableSql
    observed: Observed
    plan: Plan


def plan_now(
    source_conn: psycopg.Connection[Any],
    dest_conn: psycopg.Connection[Any] | None,
    table: TableConfig,
    templates: Templates,
    state: TableState | None,
    full_refresh: bool = False,
    ahead: ReadAhead = NOTHING_READ,
) -> Planned:
    """Inspect the table and its model on the source, observe the destination (when
    connected) and decide: what `sync` will do, as `compile`, `status` and `check` show it.
    What `ahead` read for the whole run is taken from it."""
    source, built = inspect_source(source_conn, table, templates, ahead)
    observed = observe(source_conn, dest_conn, table, built, source, state, ahead)
    plan = plan_observed(
        table, state, observed, full_refresh, destination_known=dest_conn is not None
    )
    return Planned(source, built, observed, plan)


def recheck(
    dest_conn: psycopg.Connection[Any],
    table: TableConfig,
    state: TableState | None,
    planned: Planned,
    full_refresh: bool = False,
) -> Planned | None:
    """A plan made earlier in the run (the no-op screen's), brought up to date under the
    table's lock: what can change in between is read again, in one statement: whose the
    destination table is, and whether it holds rows. None: plan the table again, because
    its destination table is not the one planned (dropped, replaced), or its source is
    partitioned (leaves may have come or gone since)."""
    observed = planned.observed
    destination = observed.destination
    if destination is None or planned.source.kind == "partitioned table":
        return None
    try:
        oid, has_rows, records = records_now(dest_conn, table.target)
    except DatabaseError:  # the table, or replicator's registry, is gone
        return None
    if oid != destination.oid:
        return None
    now = replace(observed, ownership=classify(True, records, state), destination_has_rows=has_rows)
    return replace(planned, observed=now, plan=plan_observed(table, state, now, full_refresh))
