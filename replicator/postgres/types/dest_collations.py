"""The collations of a user's own (`CREATE COLLATION`) that a table's columns use, and the
domains, ranges and composite attributes of their types, created in the destination before
the types and the table: a column `COLLATE t.ci` would otherwise fail its load with
"collation does not exist". The built-in ones (pg_catalog's, the operating system's and
ICU's imported there) exist in every database."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import psycopg
from psycopg import sql

from ..catalog import Column
from ..database import fetch_all
from .type_closure import UsedType

_QUALIFIED = (
    "pg_catalog.quote_ident(n.nspname) || '.' || pg_catalog.quote_ident(c.collname) = ANY(%s)"
)
# The whole row as JSON: the ICU locale's column is colliculocale in PostgreSQL 15 and 16,
# colllocale from 17; ICU rules (collicurules) exist from 16.
_DEFINITIONS = f"""
SELECT n.nspname, c.collname, pg_catalog.to_jsonb(c)
FROM pg_catalog.pg_collation c JOIN pg_catalog.pg_namespace n ON n.oid = c.collnamespace
WHERE n.nspname <> 'pg_catalog' AND {_QUALIFIED}
"""
_EXISTING = f"""
SELECT n.nspname, c.collname
FROM pg_catalog.pg_collation c JOIN pg_catalog.pg_namespace n ON n.oid = c.collnamespace
WHERE {_QUALIFIED}
"""

# The collations a domain, a range or a composite's attributes declare.
_OF_TYPES = """
SELECT DISTINCT pg_catalog.quote_ident(n.nspname) || '.' || pg_catalog.quote_ident(c.collname)
FROM (SELECT t.typcollation FROM pg_catalog.pg_type t WHERE t.oid = ANY(%(o)s) AND t.typtype = 'd'
      UNION SELECT r.rngcollation FROM pg_catalog.pg_range r WHERE r.rngtypid = ANY(%(o)s)
      UNION SELECT a.attcollation FROM pg_catalog.pg_type t
            JOIN pg_catalog.pg_attribute a ON a.attrelid = t.typrelid
            WHERE t.oid = ANY(%(o)s) AND t.typtype = 'c' AND a.attnum > 0 AND NOT a.attisdropped
     ) AS used(coll)
JOIN pg_catalog.pg_collation c ON c.oid = used.coll
JOIN pg_catalog.pg_namespace n ON n.oid = c.collnamespace
"""


def collation_work(
    source: psycopg.Connection[Any],
    dest: psycopg.Connection[Any],
    columns: Sequence[Column],
    types: Sequence[UsedType],
) -> tuple[list[str], list[sql.Composable]]:
    """The schemas and CREATE COLLATION statements the destination needs for the collations
    of a user's own that the columns and their user-defined `types` use."""
    named = {c.collation for c in columns if c.collation}
    built = [t.oid for t in types if t.kind in ("d", "r", "c") and not t.extension]
    if built:
        named.update(row[0] for row in fetch_all(source, _OF_TYPES, {"o": built}))
    named = {n for n in named if not n.startswith("pg_catalog.")}
    if not named:
        return [], []
    have = {tuple(row) for row in fetch_all(dest, _EXISTING, (sorted(named),))}
    schemas: list[str] = []
    statements: list[sql.Composable] = []
    for schema, name, row in fetch_all(source, _DEFINITIONS, (sorted(named),)):
        if (schema, name) in have:
            continue
        if row["collprovider"] == "i":
            locale = row.get("colllocale") or row.get("colliculocale")
            options = [("provider", "icu"), ("locale", locale)]
            if row.get("collicurules"):
                options.append(("rules", row["collicurules"]))
        else:
            options = [
                ("provider", "libc"),
                ("lc_collate", row["collcollate"]),
                ("lc_ctype", row["collctype"]),
            ]
        if not row["collisdeterministic"]:
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
