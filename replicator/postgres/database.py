"""The one place that opens connections and executes SQL (docs/architecture.md: One executor).

Every connection gets the same session settings, so values print the same way whatever the
server's or the user's defaults are. Every statement goes through `execute`: logged (redacted)
at debug level, recorded when a caller captures statements (compile's statements are
checked against these), and an error names the side it came from (`source: ...`,
`destination: ...`) with the fix where one is known. Transactions go through it too.

Kept free of heavy imports (no sqlglot): the copy tasks in Spark's workers use it.
"""

from __future__ import annotations

import contextlib
import logging
import weakref
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextvars import ContextVar
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Union

import psycopg
from psycopg import pq, sql

from ..base.errors import DatabaseError
from ..base.interrupts import track
from ..base.redact import redact

if TYPE_CHECKING:
    from sqlglot import exp

log = logging.getLogger(__name__)

Statement = Union[str, sql.Composable, "exp.Expression"]

# Settings that change how values are printed as text: pinned on both sides, so the
# text hashed and compared (md5 of every row, cursors) is the same whatever the servers say.
SESSION_SETTINGS: Mapping[str, str] = {
    "DateStyle": "ISO, YMD",
    "IntervalStyle": "postgres",
    "TimeZone": "UTC",
    "extra_float_digits": "3",
    "bytea_output": "hex",
    "lc_monetary": "C",
}

# What the server's error code says to do, where the tool knows better than the message.
FIXES: Mapping[str, str] = {
    "42501": "`replicator check` names the privilege the role lacks, and the GRANT",
    "53100": "the server's disk is full",
    "55P03": "another session holds a lock on it; the next run tries again",
    "57014": "a statement_timeout set for the role or database cancelled it; raise it",
}

_sides: weakref.WeakKeyDictionary[Any, str] = weakref.WeakKeyDictionary()


Params = Sequence[Any] | Mapping[str, Any] | None


@dataclass(frozen=True)
class Step:
    """One statement of an action's script: what `compile` prints and `sync` executes.

    `params` are bound when it runs; `compile` shows them inlined (`display`)."""

    side: str  # "source" or "destination"
    statement: Statement
    params: Params = None

    @property
    def text(self) -> str:
        return render(self.statement)


def run_steps(conn: psycopg.Connection[Any], steps: Sequence[Step]) -> None:
    """Execute a script's steps on the connection of their side, in order. A transaction the
    script began (a BEGIN step) is rolled back when a later step fails."""
    side = _sides.get(conn)
    began = conn.info.transaction_status != pq.TransactionStatus.IDLE
    try:
        for step in steps:
            assert side is None or step.side == side, (step.side, side)
            execute(conn, step.statement, step.params)
    except BaseException:
        if not began and conn.info.transaction_status != pq.TransactionStatus.IDLE:
            with contextlib.suppress(Exception):
                execute(conn, "ROLLBACK")
        raise


def display(conn: psycopg.Connection[Any], step: Step) -> str:
    """The statement as it would run, with its values inlined (for a person to read or to
    paste into psql)."""
    if step.params is None:
        return step.text
    query = step.statement if isinstance(step.statement, sql.Composable) else step.text
    return psycopg.ClientCursor(conn).mogrify(query, step.params)


@dataclass(frozen=True)
class Executed:
    """One statement a connection ran (or streamed), as `captured()` records it."""

    side: str | None
    text: str


_capture: ContextVar[list[Executed] | None] = ContextVar("replicator_capture", default=None)


def connect(
    conninfo: str,
    role: str,
    *,
    autocommit: bool = True,
    application_name: str = "replicator",
) -> psycopg.Connection[Any]:
    """Open a connection to the `role` ("source"/"destination") database, session pinned."""
    try:
        conn = psycopg.connect(
            conninfo,
            autocommit=autocommit,
            application_name=application_name,
            connect_timeout=15,
        )
    except psycopg.Error as exc:
        raise DatabaseError(f"cannot connect to the {role} database: {_message(exc)}") from None
    _sides[conn] = role
    track(conn)
    try:
        execute(
            conn,
            "SELECT set_config(name, value, false) FROM unnest(%s::text[], %s::text[]) "
            "AS s(name, value)",
            (list(SESSION_SETTINGS), list(SESSION_SETTINGS.values())),
        )
        if not autocommit:
            conn.commit()
    except DatabaseError as exc:
        conn.close()
        message = str(exc).removeprefix(f"{role}: ")
        raise DatabaseError(f"cannot configure the {role} session: {message}") from None
    return conn


def connect_all(*targets: tuple[str, str]) -> list[psycopg.Connection[Any]]:
    """A connection to each (url, role), in order, all opened at once: this thread opens the
    first while threads open the rest (each mostly waits for its server to start a backend).
    An error of any is raised (the first's first), and the others closed."""
    (url, role), rest = targets[0], targets[1:]
    with ThreadPoolExecutor(
        max_workers=max(1, len(rest)), thread_name_prefix="replicator-connect"
    ) as pool:
        opening = [pool.submit(connect, *target) for target in rest]
        opened: list[psycopg.Connection[Any]] = []
        try:
            opened.append(connect(url, role))
            opened.extend(future.result() for future in opening)
        except BaseException:
            for conn in opened:
                conn.close()
            for future in opening:
                with contextlib.suppress(BaseException):
                    future.result().close()
            raise
    return opened


def idle(conn: psycopg.Connection[Any]) -> bool:
    """Open, not broken and in no transaction: a session another step can run on."""
    return (
        not conn.closed
        and not conn.broken
        and conn.info.transaction_status == pq.TransactionStatus.IDLE
    )


def render(statement: Statement) -> str:
    """The SQL text of a statement, as it would be sent."""
    if isinstance(statement, str):
        return statement
    if isinstance(statement, sql.Composable):
        return statement.as_string(None)
    return statement.sql(dialect="postgres")  # a sqlglot expression


def execute(
    conn: psycopg.Connection[Any], statement: Statement, params: Params = None
) -> psycopg.Cursor[Any]:
    """Run one statement; errors become DatabaseError with a redacted, one-line message."""
    text = note(conn, statement)
    query = statement if isinstance(statement, sql.Composable) else text
    try:
        return conn.execute(query, params)
    except psycopg.Error as exc:
        side = _sides.get(conn)
        message = f"{side}: {_message(exc)}" if side else _message(exc)
        fix = FIXES.get(exc.sqlstate or "")
        log.debug("failed (%s): %s", exc.sqlstate, message)
        raise DatabaseError(
            f"{message} ({fix})" if fix else message, exc.sqlstate, exc.diag.message_detail
        ) from None


def note(conn: psycopg.Connection[Any], statement: Statement) -> str:
    """Log (and capture) a statement about to run; for the COPY streams a task drives through
    libpq itself, the only record they get. Returns its text."""
    text = render(statement)
    log.debug("sql: %s", redact(text))
    captured_now = _capture.get()
    if captured_now is not None:
        captured_now.append(Executed(_sides.get(conn), text))
    return text


def fetch_all(
    conn: psycopg.Connection[Any], statement: Statement, params: Params = None
) -> list[tuple[Any, ...]]:
    return execute(conn, statement, params).fetchall()


def fetch_union(
    conn: psycopg.Connection[Any], branches: Sequence[sql.Composable], chunk: int = 50
) -> list[tuple[Any, ...]]:
    """The rows of `branches` (SELECTs of the same columns) joined by UNION ALL, fifty a
    statement: PostgreSQL plans a union of a thousand subqueries in seconds, twenty unions of
    fifty in a tenth of one."""
    rows: list[tuple[Any, ...]] = []
    for start in range(0, len(branches), chunk):
        part = sql.SQL(" UNION ALL ").join(branches[start : start + chunk])
        rows.extend(execute(conn, part).fetchall())
    return rows


@contextlib.contextmanager
def transaction(
    conn: psycopg.Connection[Any], begin: str = "BEGIN", *, rollback: bool = False
) -> Iterator[None]:
    """BEGIN ... COMMIT through `execute` (a SAVEPOINT inside a transaction already open);
    ROLLBACK when the block raises, or always with `rollback` (a read-only look)."""
    nested = conn.info.transaction_status != pq.TransactionStatus.IDLE
    execute(conn, "SAVEPOINT replicator" if nested else begin)
    try:
        yield
    except BaseException:
        with contextlib.suppress(Exception):  # the error that got here is the one to report
            execute(conn, "ROLLBACK TO SAVEPOINT replicator" if nested else "ROLLBACK")
        raise
    if rollback:
        execute(conn, "ROLLBACK TO SAVEPOINT replicator" if nested else "ROLLBACK")
    else:
        execute(conn, "RELEASE SAVEPOINT replicator" if nested else "COMMIT")


@contextlib.contextmanager
def captured() -> Iterator[list[Executed]]:
    """Record every statement run (or streamed) in this thread during the block."""
    statements: list[Executed] = []
    token = _capture.set(statements)
    try:
        yield statements
    finally:
        _capture.reset(token)


def _message(exc: psycopg.Error) -> str:
    text = str(exc).strip().splitlines()
    return redact(text[0] if text else type(exc).__name__)


@dataclass(frozen=True)
class Endpoints:
    """The two databases one table's work talks to: open connections for the catalog and
    small statements, URLs for what opens its own (snapshots, Spark tasks, locks)."""

    source: psycopg.Connection[Any]
    dest: psycopg.Connection[Any]
    source_url: str
    dest_url: str


def nested_loop(on: bool) -> list[sql.Composable]:
    """The planner held to look each row of a batch up by an index (`on`), and let go
    again: over a temporary table it has no statistics of, it would rather hash the batch
    and read the whole table (cdc/apply/table_apply._write, postgres/history_tables.py)."""
    return [
        sql.SQL("SET LOCAL {} = off").format(setting) if on else sql.SQL("RESET {}").format(setting)
        for setting in (sql.Identifier("enable_hashjoin"), sql.Identifier("enable_mergejoin"))
    ]
