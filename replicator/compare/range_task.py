"""One read of a comparison inside an exported snapshot: run by Spark's Python workers for
the first, whole-table pass of a large table, so it stays light (no sqlglot)."""

from __future__ import annotations

from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from psycopg import sql

from ..base.errors import DatabaseError, TaskError
from ..postgres.database import FIXES, connect, execute, transaction
from ..postgres.snapshot import BOUNDED_LOCK_WAIT, GAVE_WAY, LOCK_TIMEOUT_SQLSTATE

BEGIN = "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY"
# A checksum scan is one long, simple expression per row: JIT compilation costs more than it
# saves, and when Spark runs the ranges in parallel, parallel workers only oversubscribe.
TUNING = ("SET LOCAL jit = off", "SET LOCAL max_parallel_workers_per_gather = 0")


@dataclass(frozen=True)
class QueryTask:
    """A query and its parameters, read on one side inside that side's snapshot."""

    side: str  # "source" or "destination"
    url: str
    snapshot: str
    query: str
    params: list[Any] = field(default_factory=list)

    def __repr__(self) -> str:  # never print connection strings
        return f"QueryTask({self.side!r})"


def run_query_task(task: QueryTask) -> list[tuple[Any, ...]]:
    """The query's rows, with sums (numeric) as ints so they compare exactly."""
    try:
        with (
            connect(task.url, task.side, application_name="replicator-verify") as conn,
            transaction(conn, BEGIN, rollback=True),
        ):
            # SET TRANSACTION SNAPSHOT must be the transaction's first statement.
            execute(conn, sql.SQL("SET TRANSACTION SNAPSHOT {}").format(sql.Literal(task.snapshot)))
            for setting in (BOUNDED_LOCK_WAIT, *TUNING):  # never queue behind an ALTER forever
                execute(conn, setting)
            rows = execute(conn, task.query, task.params).fetchall()
    except DatabaseError as exc:
        if exc.sqlstate == LOCK_TIMEOUT_SQLSTATE:  # the general fix replaced by what it was
            error = str(exc).removesuffix(f" ({FIXES[LOCK_TIMEOUT_SQLSTATE]})")
            raise TaskError(f"{error}: {GAVE_WAY}", exc.sqlstate) from None
        raise TaskError(str(exc), exc.sqlstate) from None
    return [exact(row) for row in rows]


def exact(row: tuple[Any, ...]) -> tuple[Any, ...]:
    """Sums come back as numeric: as ints they compare exactly (and pickle small)."""
    return tuple(int(v) if isinstance(v, Decimal) else v for v in row)
