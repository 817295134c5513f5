"""The collations of a user's own (`CREATE COLLATION`) that a table's columns use, created in
the destination before the table: a column `COLLATE t.ci` would otherwise fail its load with
"collation does not exist". The built-in ones (pg_catalog's, the operating system's and
ICU's imported there) exist in every database."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import psycopg
from psycopg import sql

from .catalog import Column
from .database import fetch_all

_QUALIFIED = (
    "pg_catalog.quote_ident(n.nspname) || '.' || pg_catalog.quote_ident(c.collname) = ANY(%s)"
)
_DEFINITIONS = f"""
SELECT n.nspname, c.collname, c.collprovider, c.collcollate, c.collctype, c.colliculocale,
       c.collisdeterministic
FROM pg_catalog.pg_collation c JOIN pg_catalog.pg_namespace n ON n.oid = c.collnamespace
WHERE n.nspname <> 'pg_catalog' AND {_QUALIFIED}
"""
_EXISTING = f"""
SELECT n.nspname, c.collname
FROM pg_catalog.pg_collation c JOIN pg_catalog.pg_namespace n ON n.oid = c.collnamespace
WHERE {_QUALIFIED}
"""


def collation_work(
    source: psycopg.Connection[Any], dest: psycopg.Connection[Any], columns: Sequence[Column]
) -> tuple[list[str], list[sql.Composable]]:
    """The schemas and CREATE COLLATION statements the destination needs for the columns'
    collations of a user's own (none: no catalog read)."""
    named = sorted({c.collation for c in columns if c.collation})
    named = [n for n in named if not n.startswith("pg_catalog.")]
    if not named:
        return [], []
    have = {tuple(row) for row in fetch_all(dest, _EXISTING, (named,))}
    schemas: list[str] = []
    statements: list[sql.Composable] = []
    for schema, name, provider, collate, ctype, icu, deterministic in fetch_all(
        source, _DEFINITIONS, (named,)
    ):
        if (schema, name) in have:
            continue
        if provider == "i":
            options = [("provider", "icu"), ("locale", icu)]
        else:
            options = [("provider", "libc"), ("lc_collate", collate), ("lc_ctype", ctype)]
        if not deterministic:
            options.append(("deterministic", "false"))
        schemas.append(schema)
        statements.append(
            sql.SQL("CREATE COLLATION IF NOT EXISTS {} ({})").format(
                sql.Identifier(schema, name),
                sql.SQL(", ").join(
                    sql.SQL("{} = {}").format(sql.SQL(key), sql.Literal(value))
                    for key, value in options
                ),
            )
        )
    return schemas, statements
