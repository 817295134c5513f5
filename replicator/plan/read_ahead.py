"""What planning a whole project reads from both catalogs, read for all its tables at once:
each table's description on either side, the destination's ownership records and whether
each copy holds rows. Every kind of fact is one round trip for 1,000 tables; each table then
takes its own facts (postgres/prefetch.py) as `plan_now` reaches it."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import psycopg
from psycopg import sql

from ..postgres import prefetch
from ..postgres.catalog import describe_tables
from ..postgres.database import fetch_union
from ..postgres.ownership import read_many_records
from ..project.config import TableConfig


def read_ahead(
    source: psycopg.Connection[Any],
    dest: psycopg.Connection[Any] | None,
    tables: Sequence[TableConfig],
) -> None:
    """Read the planning facts of these tables in a few round trips (none are kept for a
    table whose turn reads them again: a fact is taken once)."""
    if len(tables) < 2:
        return  # one table: its own reads are as many round trips
    describe_tables(source, [t.source for t in tables])
    if dest is None:
        return
    described = describe_tables(dest, [t.target for t in tables])
    read_many_records(dest, {t: (info.oid if info else None) for t, info in described.items()})
    present = [t.target for t in tables if described.get(t.target) is not None]
    if present:
        branches = [
            sql.SQL("SELECT {}::int, EXISTS (SELECT FROM {})").format(
                sql.Literal(i), t.identifier()
            )
            for i, t in enumerate(present)
        ]
        rows = fetch_union(dest, branches)
        prefetch.put_many(dest, "has_rows", {present[i]: bool(has) for i, has in rows})
