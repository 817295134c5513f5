"""A user's range type in the destination: created with the source's definition, or, when
the destination has it already, checked to be a range of the same subtype."""

from __future__ import annotations

from typing import Any

import psycopg
from psycopg import sql

from ..base.errors import TableProblem
from .database import fetch_all
from .types.type_alignment import drop_by_hand, qualified_rows

# A range type's definition, as CREATE TYPE ... AS RANGE takes it (functions and names printed
# under search_path pg_catalog: a user's qualified, a built-in one bare).
_RANGE = """
SELECT pg_catalog.format_type(r.rngsubtype, NULL),
       CASE WHEN NOT o.opcdefault THEN
           pg_catalog.quote_ident(on_.nspname) || '.' || pg_catalog.quote_ident(o.opcname) END,
       (SELECT pg_catalog.quote_ident(cn.nspname) || '.' || pg_catalog.quote_ident(c.collname)
        FROM pg_catalog.pg_collation c JOIN pg_catalog.pg_namespace cn ON cn.oid = c.collnamespace
        WHERE c.oid = r.rngcollation AND r.rngcollation <> st.typcollation),
       CASE WHEN r.rngcanonical::oid <> 0 THEN r.rngcanonical::text END,
       CASE WHEN r.rngsubdiff::oid <> 0 THEN r.rngsubdiff::text END,
       (SELECT pg_catalog.quote_ident(mn.nspname) || '.' || pg_catalog.quote_ident(m.typname)
        FROM pg_catalog.pg_type m JOIN pg_catalog.pg_namespace mn ON mn.oid = m.typnamespace
        WHERE m.oid = r.rngmultitypid)
FROM pg_catalog.pg_range r
JOIN pg_catalog.pg_type st ON st.oid = r.rngsubtype
JOIN pg_catalog.pg_opclass o ON o.oid = r.rngsubopc
JOIN pg_catalog.pg_namespace on_ ON on_.oid = o.opcnamespace
WHERE r.rngtypid = %s
"""
_LACKS = "SELECT pg_catalog.to_regproc(%s) IS NULL"
_RANGE_SUBTYPE = (
    "SELECT pg_catalog.format_type(rngsubtype, NULL) FROM pg_catalog.pg_range WHERE rngtypid = %s"
)


def range_statements(
    source: psycopg.Connection[Any],
    dest: psycopg.Connection[Any],
    oid: int,
    qualified: sql.Identifier,
    existing: list[tuple[Any, ...]],
) -> list[sql.Composable]:
    """CREATE TYPE ... AS RANGE with the source's subtype, operator class, collation,
    functions and multirange name; nothing for one the destination has on the same subtype."""
    subtype, opclass, collation, canonical, diff, multirange = fetch_all(source, _RANGE, (oid,))[0]
    if existing:
        (have,) = qualified_rows(dest, _RANGE_SUBTYPE, existing[0][0])[0]
        if have != subtype:
            raise drop_by_hand(
                f"range type {qualified.as_string(None)} is a range of {have} in the "
                f"destination and of {subtype} in the source",
                "TYPE",
                qualified.as_string(None),
            )
        return []
    user = [f for f in (canonical, diff) if f is not None and "." in f]  # a user's: qualified
    lacking = [f for f in user if fetch_all(dest, _LACKS, (f,))[0][0]]
    if lacking:
        raise TableProblem(
            f"range type {qualified.as_string(None)} uses function(s) {', '.join(lacking)}, "
            "which the destination lacks: create them there (the same definitions as in the "
            "source), then sync again"
        )
    options = [sql.SQL("SUBTYPE = {}").format(sql.SQL(subtype))]
    for option, value in (
        ("SUBTYPE_OPCLASS", opclass),
        ("COLLATION", collation),
        ("CANONICAL", canonical),
        ("SUBTYPE_DIFF", diff),
        ("MULTIRANGE_TYPE_NAME", multirange),
    ):
        if value is not None:
            options.append(sql.SQL("{} = {}").format(sql.SQL(option), sql.SQL(value)))
    return [sql.SQL("CREATE TYPE {} AS RANGE ({})").format(qualified, sql.SQL(", ").join(options))]


def range_definition(conn: psycopg.Connection[Any], oid: int) -> list[Any]:
    """What CREATE TYPE ... AS RANGE would say (schema drift compares it), under the
    caller's search_path of pg_catalog."""
    return [*fetch_all(conn, _RANGE, (oid,))[0]]
