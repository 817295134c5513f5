"""What bringing a destination type in line with the source's needs on both sides: its
catalog rows printed alike, and the error when PostgreSQL cannot change it in place."""

from __future__ import annotations

from typing import Any

import psycopg

from ...base.errors import TableProblem
from ..database import execute, fetch_all, transaction


def qualified_rows(conn: psycopg.Connection[Any], query: str, oid: int) -> list[tuple[Any, ...]]:
    """A catalog query about one type, with type names printed schema-qualified (as on the
    source side), whatever the connection's search_path."""
    with transaction(conn):
        execute(conn, "SET LOCAL search_path = pg_catalog, pg_temp")
        return fetch_all(conn, query, (oid,))


def drop_by_hand(problem: str, kind: str, name: str) -> TableProblem:
    """A type the destination cannot be brought in line with: what differs, and the fix
    (`name` is already quoted)."""
    return TableProblem(
        f"{problem}: drop it in the destination (DROP {kind} {name} CASCADE also drops the "
        f"columns that use it), then run `replicator sync -f` for the tables that use it"
    )
