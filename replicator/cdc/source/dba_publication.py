"""What a publication a DBA made (`"cdc": {"create": false}`) must give a table, or its copy
silently misses changes: every kind of change published (a publication made with `publish =
'insert, update'` never sends the deletes), and the table's rows and columns whole (a
PostgreSQL 15 row filter leaves rows out, a column list leaves columns out: the log would
then show a shape change on every run), and a partitioned table's changes under its own name
(`publish_via_partition_root`: without it they come under each partition's name, which no
copy takes). The tool's own publications are always made so.
"""

from __future__ import annotations

from typing import Any

import psycopg
from psycopg import sql

from ...base.identifiers import TableName
from ...postgres.database import fetch_all
from .log_filter import PublishedAs
from .slot import publishes_via_root, via_root_statement

_PUBLISHES = """
SELECT p.pubinsert, p.pubupdate, p.pubdelete, p.pubtruncate
FROM pg_catalog.pg_publication p WHERE p.pubname = %s
"""
_TABLE = """
SELECT t.rowfilter, t.attnames
FROM pg_catalog.pg_publication_tables t
WHERE t.pubname = %s AND t.schemaname = %s AND t.tablename = %s
"""
KINDS = ("insert", "update", "delete", "truncate")


def publication_problem(
    source: psycopg.Connection[Any],
    publication: str,
    table: TableName,
    columns: list[str],
    where: str | None = None,
    alone: bool = False,
) -> tuple[str, str] | None:
    """What the DBA's publication withholds from the table, and the statements that give
    it; None when it publishes every change of the rows and `columns` the copy holds. With
    the table's `where`, the publication must filter rows itself (its filter is taken to be
    the same: PostgreSQL keeps it in another form, which cannot be compared). `alone`: the
    table has child tables (catalog.TableInfo.has_children), listed `ONLY`."""
    flags = fetch_all(source, _PUBLISHES, (publication,))
    rows = fetch_all(source, _TABLE, (publication, table.schema, table.name))
    if not flags or not rows:
        return None  # missing, or without the table: said elsewhere
    problems, fixes = [], []
    left_out = [kind for kind, published in zip(KINDS, flags[0], strict=True) if not published]
    if left_out:
        problems.append("it does not publish " + " or ".join(f"{kind}s" for kind in left_out))
        fixes.append(
            sql.SQL("ALTER PUBLICATION {} SET (publish = 'insert, update, delete, truncate')")
            .format(sql.Identifier(publication))
            .as_string(None)
        )
    row_filter, published_columns = rows[0]
    missing = [c for c in columns if c not in (published_columns or [])]
    unfiltered = where is not None and row_filter is None
    if row_filter is not None and where is None:
        problems.append(f"a row filter (WHERE {row_filter}) leaves rows out")
    if unfiltered:
        problems.append(
            f"it has no row filter, so rows updated out of the table's where ({where}) would "
            "stay in the copy"
        )
    if missing:
        problems.append(f"its column list leaves out {', '.join(missing)}")
    if (row_filter is not None and where is None) or unfiltered or missing:
        listing = PublishedAs(None, where, alone).element(table.identifier())
        statements = [
            sql.SQL("ALTER PUBLICATION {} DROP TABLE ONLY {}")
            .format(sql.Identifier(publication), table.identifier())
            .as_string(None),
            sql.SQL("ALTER PUBLICATION {} ADD TABLE {}")
            .format(sql.Identifier(publication), listing)
            .as_string(None),
        ]
        fixes.append("; ".join(statements) + f", then `replicator refresh {table}`")
    if not problems:
        return None
    problem = (
        f"publication {publication} (named in tables-config.json `cdc`) withholds changes: "
        + "; ".join(problems)
        + ", so the copy would silently miss them"
    )
    return problem, "a DBA runs " + "; ".join(fixes)


def via_root_problem(
    source: psycopg.Connection[Any], publication: str, table: TableName
) -> tuple[str, str] | None:
    """For a partitioned table: the DBA's publication sends its changes under each
    partition's name (publish_via_partition_root off), and the statement that fixes it."""
    if publishes_via_root(source, publication):
        return None
    return (
        f"publication {publication} (named in tables-config.json `cdc`) has "
        f"publish_via_partition_root off: the changes of partitioned table {table} would "
        "arrive under its partitions' names, and the copy would never get them",
        f"a DBA runs {via_root_statement(publication)}",
    )
