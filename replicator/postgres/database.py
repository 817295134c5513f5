"""The one place that opens connections and executes SQL.

Every connection gets the same session settings, so values print the same way whatever the
server's or the user's defaults are; every statement is logged (redacted) at debug level,
and an error names the side it came from (`source: ...`, `destination: ...`).
"""

from __future__ import annotations

import logging
import weakref
from collections.abc import Mapping, Sequence
from typing import Any

import psycopg
from psycopg import sql
from sqlglot import exp

from ..errors import DatabaseError
from ..interrupts import track
from ..redact import redact
from .pgsession import pin_session

log = logging.getLogger(__name__)

Statement = str | sql.Composable | exp.Expression

_sides: weakref.WeakKeyDictionary[Any, str] = weakref.WeakKeyDictionary()


def connect(conninfo: str, role: str) -> psycopg.Connection[Any]:
    """Open an autocommit connection to the `role` ("source"/"destination") database."""
    try:
        conn = psycopg.connect(
            conninfo, autocommit=True, application_name="replicator", connect_timeout=15
        )
    except psycopg.Error as exc:
        raise DatabaseError(f"cannot connect to the {role} database: {_message(exc)}") from None
    try:
        pin_session(conn)
    except psycopg.Error as exc:
        conn.close()
        raise DatabaseError(f"cannot configure the {role} session: {_message(exc)}") from None
    _sides[conn] = role
    return track(conn)


def render(statement: Statement) -> str:
    """The SQL text of a statement, as it would be sent."""
    if isinstance(statement, exp.Expression):
        return statement.sql(dialect="postgres")
    if isinstance(statement, sql.Composable):
        return statement.as_string(None)
    return statement


def execute(
    conn: psycopg.Connection[Any],
    statement: Statement,
    params: Sequence[Any] | Mapping[str, Any] | None = None,
) -> psycopg.Cursor[Any]:
    """Run one statement; errors become DatabaseError with a redacted, one-line message."""
    text = render(statement)
    log.debug("sql: %s", redact(text))
    query = statement if isinstance(statement, sql.Composable) else text
    try:
        return conn.execute(query, params)
    except psycopg.Error as exc:
        side = _sides.get(conn)
        message = f"{side}: {_message(exc)}" if side else _message(exc)
        log.debug("failed (%s): %s", exc.sqlstate, message)
        raise DatabaseError(message, exc.sqlstate, exc.diag.message_detail) from None


def fetch_all(
    conn: psycopg.Connection[Any],
    statement: Statement,
    params: Sequence[Any] | Mapping[str, Any] | None = None,
) -> list[tuple[Any, ...]]:
    return execute(conn, statement, params).fetchall()


def _message(exc: psycopg.Error) -> str:
    text = str(exc).strip().splitlines()
    return redact(text[0] if text else type(exc).__name__)
