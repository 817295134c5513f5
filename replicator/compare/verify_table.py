"""One table's verification: is the destination what the model reads from the source?

Each side is read in one snapshot. Rows the cursor has yet to reach (replication key at or
past the cursor in sync-state, or NULL) are counted as not yet synced, never as differences:
the next sync copies them, when something there changed since the last one (else it is a
no-op, and a row there that differs stays a difference). With `repair`, the table's
destination lock is held from before the snapshots until the last fix commits, so no sync of
the table runs in between (a repair must never write an older row over one a sync has just
merged). A table without a key is compared as a multiset of rows instead (multiset.py): a
missing key never fails it.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass, field, replace
from typing import Any

import psycopg
from psycopg import sql

from ..base.errors import ReplicatorError, TableProblem, one_line
from ..base.interrupts import raise_if_requested
from ..plan.cursor import changed_since
from ..plan.decide import delete_check_due
from ..plan.drift import Planned, plan_now
from ..plan.table_sql import TableSql
from ..postgres.database import Endpoints, execute
from ..postgres.open_transactions import widen
from ..postgres.snapshot import ExportedSnapshot
from ..postgres.table_lock import table_lock
from ..project.config import TableConfig
from ..project.state import TableState
from ..project.templates import Templates
from ..spark.runner import SparkRunner
from . import range_sql as q
from .bisect import Found, Key
from .caught_up import caught_up
from .comparison import Fresh, Sides, compared, sides_of
from .history_check import HistoryFindings, check_history, repair_history
from .multiset import diff_multisets, examples, repair_multiset
from .reader import RangeReader
from .repair import MARK_COLUMN, repair
from .thresholds import INTEGER_TYPES, estimated_rows
from .verdict import MAX_EXAMPLES, REPEATED_KEY, Verdict

# A `cdc` table's keys that changes in the slot, not yet applied, touch (cdc/pending.py;
# commands/verify.py binds it): given the key's columns and the differing keys, those with
# a pending change, or None when a pending TRUNCATE touches them all. The third argument:
# changes count from the table's applied position now, not the one read before the
# comparison (the rows were read again since: caught_up.py).
PendingLookup = Callable[[tuple[str, ...], list[Key], bool], Collection[Key] | None]
_DIFFERENCES = ("missing", "extra", "different")
MAX_KEYS_PER_READ = 10_000


def verify_table(
    ends: Endpoints,
    table: TableConfig,
    templates: Templates,
    state: TableState | None,
    spark: SparkRunner,
    *,
    fix: bool = False,
    force: bool = False,
    pending: PendingLookup | None = None,
    source_snapshot: str | None = None,
) -> Verdict:
    """Compare (and with `fix`, repair) one table; a problem is a `failed` verdict. A repair
    that would delete more than half of the destination's rows is refused (the verdict says
    so) unless `force`: a broken or emptied model must not empty the copy. `pending`: for a
    `cdc` table, its changes still in the slot. `source_snapshot`: compare with that
    exported snapshot of the source (a new slot's) instead of a snapshot taken now."""
    started = time.monotonic()
    try:
        planned = plan_now(ends.source, ends.dest, table, templates, state)
        _comparable(table, planned)
        lock = (
            table_lock(
                ends.dest_url,
                table.target,
                table.written_name,
                "not repaired: run `verify --repair` again once it is done",
            )
            if fix
            else contextlib.nullcontext()
        )
        with lock:
            if planned.built.primary_key:
                tally = _compare(
                    ends, table, planned, state, spark, fix, force, pending, source_snapshot
                )
            else:
                tally = _compare_keyless(ends, table, planned, fix, force)
            history = _check_history(ends, planned, fix)
    except (ReplicatorError, psycopg.Error) as exc:
        raise_if_requested()  # a query cancelled by SIGTERM/SIGINT: the run stops, not the table
        error = one_line(exc).removeprefix(f"{table.written_name}: ")  # the verdict names it
        return Verdict(
            table.written_name, "failed", error=error, seconds=time.monotonic() - started
        )
    history_differs = history is not None and history.differences > 0
    return Verdict(
        table.written_name,
        "different" if tally.differences or history_differs else "equal",
        rows_compared=tally.rows_compared,
        missing=tally.missing,
        extra=tally.extra,
        different=tally.different,
        not_yet_synced=tally.not_yet_synced,
        repaired=tally.repaired,
        repeated_keys=tally.repeated_keys,
        examples=tally.examples,
        error=_refusal(table, tally) if fix and not force and tally.repaired == 0 else None,
        seconds=time.monotonic() - started,
        history=history,
    )


def _check_history(ends: Endpoints, planned: Planned, fix: bool) -> HistoryFindings | None:
    """The table's history table against its copy (history_check.py), after the copy's
    repair; with `fix`, repaired when it differs."""
    history = planned.built.history
    if history is None:
        return None
    destination = planned.observed.destination
    marked = destination is not None and destination.column(MARK_COLUMN) is not None
    present = (
        sql.SQL("c.{} IS NULL").format(sql.Identifier(MARK_COLUMN)) if marked else sql.SQL("true")
    )
    if planned.observed.history_missing is not None:
        raise TableProblem(
            f"{planned.built.table.written_name}: history table {history.name} does not exist: "
            f"the next sync reloads the table and begins it again"
        )
    found = check_history(ends.dest, history, present)
    if not fix or not found.differences:
        return found
    (now,) = execute(ends.source, "SELECT now()").fetchone()
    return replace(found, repaired=repair_history(ends.dest, history, present, now))


@dataclass(frozen=True)
class _Tally:
    """What a comparison found and repaired, counted (rows, with their copies for a table
    without a key)."""

    rows_compared: int
    destination_rows: int
    missing: int
    extra: int
    different: int = 0
    not_yet_synced: int = 0
    repaired: int = 0
    examples: list[dict[str, Any]] = field(default_factory=list)
    repeated_keys: int = 0

    @property
    def differences(self) -> int:
        return self.missing + self.extra + self.different


def _too_many(extra: int, destination_rows: int) -> bool:
    return 2 * extra > destination_rows


def _refusal(table: TableConfig, tally: _Tally) -> str | None:
    if not (tally.differences and _too_many(tally.extra, tally.destination_rows)):
        return None
    return (
        f"repair refused: it would delete {tally.extra:,} of {tally.destination_rows:,} "
        f"rows, more than half; if the source really lost them, run `replicator verify "
        f"--repair --force -s {table.written_name}`"
    )


def _comparable(table: TableConfig, planned: Planned) -> None:
    """What must hold before two sides can be compared row by row."""
    name = table.written_name
    if planned.plan.action == "fail":
        raise TableProblem(f"{name}: {planned.plan.reason}; {planned.plan.fix}")
    if planned.observed.destination is None:
        raise TableProblem(
            f"{name}: destination table {table.target} does not exist yet: "
            f"run `replicator sync -s {name}` first"
        )
    if planned.observed.schema_change:
        raise TableProblem(
            f"{name}: the source schema changed since the last load "
            f"({planned.observed.schema_change}): the next sync reloads the table; "
            f"run `replicator sync -s {name}` first"
        )
    if planned.observed.model_change:
        raise TableProblem(
            f"{name}: {planned.observed.model_change} (since the last load): the next sync "
            f"reloads the table; run `replicator sync -s {name}` first"
        )
    model = [(c.name, c.type) for c in planned.built.columns]
    there = [
        (c.name, c.type) for c in planned.observed.destination.columns if c.name != MARK_COLUMN
    ]
    if model != there:
        reload = "" if table.mode == "full-refresh" else " -f"
        raise TableProblem(
            f"{name}: the destination table's columns are not the model's; "
            f"run `replicator sync{reload} -s {name}` to reload it"
        )


def _compare(
    ends: Endpoints,
    table: TableConfig,
    planned: Planned,
    state: TableState | None,
    spark: SparkRunner,
    fix: bool,
    force: bool,
    pending: PendingLookup | None,
    source_snapshot: str | None,
) -> _Tally:
    built = planned.built
    assert planned.observed.destination is not None
    # An append table keeps each key's first version by design: only its keys can differ.
    sides = sides_of(
        ends,
        table,
        built,
        planned.observed.destination.columns,
        keys_only=table.mode == "incremental-append",
    )
    with (
        built.reading_model(),
        compared(ends, table, sides, spark, _fresh(built, state), source_snapshot) as (
            found,
            reader,
        ),
    ):
        _set_aside_pending(table, state, planned.built.primary_key, found, pending)
        _set_aside_deleted(table, state, found, reader, sides)
        if table.mode == "cdc" and pending is not None and found.differences:
            differing = [*found.missing, *found.extra, *found.different]
            columns = [c.name for c in built.columns]
            settled = caught_up(
                ends, sides, columns, differing, lambda keys: pending(built.primary_key, keys, True)
            )
            found.set_aside(lambda k: k in settled, _DIFFERENCES)
        repaired = 0
        if fix and found.differences and (force or not _found_too_many(found)):
            repaired = repair(ends.dest, reader, sides.shape, sides.source, sides.target, found)
    return _Tally(
        found.rows_compared,
        found.destination_rows,
        missing=len(found.missing),
        extra=len(found.extra),
        different=len(found.different),
        not_yet_synced=len(found.not_yet_synced),
        repaired=repaired,
        examples=_examples(sides.shape, found),
        repeated_keys=len(found.repeated),
    )


def _found_too_many(found: Found) -> bool:
    return _too_many(len(found.extra), found.destination_rows)


def _compare_keyless(
    ends: Endpoints, table: TableConfig, planned: Planned, fix: bool, force: bool
) -> _Tally:
    """A table without a key (full-refresh only), as a multiset of rows (multiset.py)."""
    built = planned.built
    assert planned.observed.destination is not None
    sides = sides_of(ends, table, built, planned.observed.destination.columns)
    rows, _ = estimated_rows(ends.dest, table.target)
    with (
        built.reading_model(),
        ExportedSnapshot(ends.source_url, "source") as ours,
        ExportedSnapshot(ends.dest_url, "destination") as theirs,
    ):
        reader = RangeReader(ours, theirs)
        diff = diff_multisets(reader, sides.shape, sides.source, sides.destination, rows)
        types = {c.name: c.type for c in built.columns}
        shown = examples(reader, sides.shape, (sides.source, sides.destination), types, diff)
        repaired = 0
        allowed = force or not _too_many(diff.extra_rows, diff.destination_rows)
        if fix and allowed and (diff.missing or diff.extra):
            repaired = repair_multiset(
                ends.dest, reader, sides.shape, sides.source, sides.target, diff
            )
    return _Tally(
        diff.rows_compared,
        diff.destination_rows,
        missing=diff.missing_rows,
        extra=diff.extra_rows,
        repaired=repaired,
        examples=shown,
    )


def _set_aside_pending(
    table: TableConfig,
    state: TableState | None,
    key: tuple[str, ...],
    found: Found,
    pending: PendingLookup | None,
) -> None:
    """Differences the next sync resolves are not yet synced (a cursor table's rows at or
    past its cursor were set aside while they were read, `_fresh`; rows deleted in the
    source, `_set_aside_deleted`): for `cdc`, a row whose change is still in the slot.
    A full-refresh table's differences stay differences: which rows changed since its
    reload cannot be told from a tampered copy (docs/guides/verify.md)."""
    if not found.differences:
        return
    if table.mode == "cdc" and pending is not None and found.differences:
        differing = [*found.missing, *found.extra, *found.different]
        waiting = pending(key, differing, False)
        found.set_aside(lambda k: waiting is None or k in waiting, _DIFFERENCES)


def _set_aside_deleted(
    table: TableConfig, state: TableState | None, found: Found, reader: RangeReader, sides: Sides
) -> None:
    """`deletes: delete` or `mark`: a row gone from the source since the copy was last made
    exact (its last delete check, or a load) is deleted or marked by the next check, when the
    next sync runs one (`deletes_interval` passed) and they are not more than half of the
    copy (the check refuses those until `sync --deletes --force`, so they stay
    differences): not yet synced. A row written into the copy since then by someone else
    (its xmin at or past the state's `exact_xmax`) was never the source's: extra, and
    `--repair` removes it."""
    if not found.extra or not delete_check_due(table, state) or _found_too_many(found):
        return
    exact = state.exact_xmax if state is not None else None
    if exact is None:  # not recorded yet: every such row is taken to be the source's
        found.set_aside(lambda _: True, ("extra",))
        return
    written_later = set()
    for start in range(0, len(found.extra), MAX_KEYS_PER_READ):
        keys = found.extra[start : start + MAX_KEYS_PER_READ]
        params: list[Any] = []
        rows = reader.one(
            "destination",
            (
                sql.SQL(
                    "SELECT {keys}, {alias}.xmin::text, "
                    "pg_catalog.pg_snapshot_xmax(pg_catalog.pg_current_snapshot())::text "
                    "FROM {source} WHERE {match}"
                ).format(
                    keys=sides.shape.key_text(),
                    alias=q.ident(q.ALIAS),
                    source=sides.destination.from_clause(),
                    match=q.keys_in(sides.shape, keys, params),
                ),
                params,
            ),
        )
        width = len(sides.shape.key)
        written_later.update(
            tuple(row[:width])
            for row in rows
            if widen(int(row[width]), int(row[width + 1])) >= int(exact)
        )
    found.set_aside(lambda k: tuple(k) not in written_later, ("extra",))


def _fresh(built: TableSql, state: TableState | None) -> Fresh | None:
    """`the cursor has yet to reach this source row`, when the table has been synced and its
    next sync reads the rows at or past its cursor (every row while it has none: a load
    beside open transactions leaves the cursor to the next sync, which reads them all).
    When nothing there changed since the last sync read them (the probe a sync runs first,
    asked in the comparison's own snapshot), that sync is a no-op: a row that differs there
    (one changed in the copy by hand) stays as it is, so it is a difference, not a row not
    yet synced."""
    table = built.table
    key = table.replication_key
    if key is None or table.mode == "full-refresh" or state is None or not state.last_synced_at:
        return None
    test: sql.Composable = sql.SQL("true")  # no cursor yet (a load beside open writers)
    values: list[Any] = []
    if state.cursor is not None:
        column = next(c for c in built.columns if c.name == key)
        ref = sql.SQL("{}.{}").format(q.ident(q.ALIAS), q.ident(key))
        test = sql.SQL("{} >= %s::{}").format(ref, sql.SQL(column.type))
        if not column.not_null:
            test = sql.SQL("({} OR {} IS NULL)").format(test, ref)
        values = [state.cursor.value]

    def on(snapshot: psycopg.Connection[Any]) -> tuple[sql.Composable, list[Any]] | None:
        assert state is not None
        return (test, values) if changed_since(snapshot, built, state) else None

    return on


def _examples(shape: q.Shape, found: Found) -> list[dict[str, Any]]:
    kinds = (("missing", found.missing), ("extra", found.extra), ("different", found.different))
    out: list[dict[str, Any]] = []
    for kind, keys in kinds:
        for key in keys[: MAX_EXAMPLES - len(out)]:
            out.append({"key": _key_values(shape, key), "kind": kind})
    for key in found.repeated[: MAX_EXAMPLES - len(out)]:  # not differences: named apart
        out.append({"key": _key_values(shape, key), "kind": REPEATED_KEY})
    return out


def _key_values(shape: q.Shape, key: Key) -> dict[str, Any]:
    """A key as JSON: integers as numbers, everything else as PostgreSQL prints it."""
    return {
        k.name: int(v) if v is not None and k.type in INTEGER_TYPES else v
        for k, v in zip(shape.key, key, strict=True)
    }
