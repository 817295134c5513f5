"""What planning a run's tables reads from both catalogs, read for all of them at once and
handed to each table's plan: each table's description on either side, the destination's
ownership records, whether each copy holds rows, and the tables a killed run left behind.
Every kind of fact is one round trip for 1,000 tables.

The facts are a value the caller holds and passes down (`plan_now(..., ahead=)`): a table's
first plan in a run takes them from it. What can change between this read and a table's
turn (its ownership and whether its copy holds rows) is read again under the table's lock
(sync/run.py)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import psycopg
from psycopg import sql

from ..base.identifiers import TableName
from ..postgres.catalog import TableInfo, describe_tables
from ..postgres.database import fetch_all, fetch_union
from ..postgres.naming import retired_table, staging_tables
from ..postgres.ownership import Records, read_many_records
from ..project.config import TableConfig


@dataclass(frozen=True)
class ReadAhead:
    """The planning facts of a set of tables; a table not among them is read on its own."""

    sources: Mapping[TableName, TableInfo | None] = field(default_factory=dict)
    # None: the destination was not read (no connection to it)
    destinations: Mapping[TableName, TableInfo | None] | None = None
    records: Mapping[TableName, Records] = field(default_factory=dict)
    has_rows: Mapping[TableName, bool] = field(default_factory=dict)
    # the staging tables and retired copies that exist in the destination (sync/scripts.py)
    leftovers: frozenset[TableName] = frozenset()


NOTHING_READ = ReadAhead()


def read_ahead(
    source: psycopg.Connection[Any],
    dest: psycopg.Connection[Any] | None,
    tables: Sequence[TableConfig],
) -> ReadAhead:
    """Read the planning facts of these tables in a few round trips."""
    if not tables:
        return NOTHING_READ
    sources = describe_tables(source, [t.source for t in tables])
    if dest is None:
        return ReadAhead(sources)
    described = describe_tables(dest, [t.target for t in tables])
    records = read_many_records(
        dest, {t: (info.oid if info else None) for t, info in described.items()}
    )
    present = [t for t, info in described.items() if info is not None]
    has_rows: dict[TableName, bool] = {}
    if present:
        branches = [
            sql.SQL("SELECT {}::int, EXISTS (SELECT FROM {})").format(
                sql.Literal(i), t.identifier()
            )
            for i, t in enumerate(present)
        ]
        has_rows = {present[i]: bool(has) for i, has in fetch_union(dest, branches)}
    return ReadAhead(
        sources, described, records, has_rows, _leftovers(dest, [t.target for t in tables])
    )


def _leftovers(dest: psycopg.Connection[Any], targets: Sequence[TableName]) -> frozenset[TableName]:
    """Which of the tables' staging tables and retired copies exist: what a killed run left."""
    names = [n for t in targets for n in (retired_table(t), *staging_tables(t))]
    rows = fetch_all(
        dest,
        "SELECT n.nspname, c.relname FROM pg_catalog.pg_class c "
        "JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace "
        "WHERE (n.nspname, c.relname) IN (SELECT * FROM unnest(%s::text[], %s::text[]))",
        ([n.schema for n in names], [n.name for n in names]),
    )
    return frozenset(TableName(schema, name) for schema, name in rows)
