"""`"initial_load": "skip"`: a table's first sync copies no existing row.

The destination table is created empty (or adopted when it already exists with the source's
shape, e.g. loaded by hand; either way recorded as the tool's from then on), and the cursor
starts at the source's newest key, read with the same rules as after a full load: writers in
progress hold it back, so no row they commit later is skipped. Rows at the starting key
itself are read by the next sync (ties are never skipped).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import psycopg

from ..base.errors import TableProblem
from ..plan.cursor import first_cursor
from ..plan.schema_diff import describe, diff
from ..plan.signature import Signature, destination_signature
from ..plan.table_sql import TableSql
from ..postgres.catalog import TableInfo
from ..postgres.database import Endpoints, execute, run_steps
from ..project.state import Cursor, Pending, Window
from .scripts import DestinationFacts, start_steps


@dataclass(frozen=True)
class StartResult:
    created: bool
    cursor: Cursor | None
    pending: Pending | None
    window: Window | None


def start_without_backfill(
    ends: Endpoints, built: TableSql, destination: TableInfo | None, signature: Signature
) -> StartResult:
    """Create or adopt the destination table; the cursor at the source's newest key."""
    if destination is not None:
        require_same_shape(built, destination, signature, "drop it (the sync then creates it)")
    facts = DestinationFacts.read(ends.source, ends.dest, built, types=destination is None)
    run_steps(ends.dest, start_steps(built, facts, exists=destination is not None))
    cursor, pending, window = _start_cursor(ends.source, built)
    return StartResult(destination is None, cursor, pending, window)


def require_same_shape(
    built: TableSql, destination: TableInfo, signature: Signature, fix: str
) -> None:
    """An existing destination table is adopted only with the source's columns, types and
    key: TableProblem naming the differences and `fix` otherwise."""
    changes = diff(signature.as_created(), destination_signature(destination))
    if changes:
        raise TableProblem(
            f"{built.table.written_name}: initial_load skip adopts the existing destination "
            f"table {built.table.target}, but it differs from the source ({describe(changes)}); "
            f"make it match, or {fix}"
        )


def _start_cursor(
    conn: psycopg.Connection[Any], built: TableSql
) -> tuple[Cursor | None, Pending | None, Window | None]:
    execute(conn, "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
    try:
        return first_cursor(conn, built)
    finally:
        execute(conn, "ROLLBACK")
