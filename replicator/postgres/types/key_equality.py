"""Each column's equality as its type's btree operator class defines it, where `=` written
in a statement may not find it.

PostgreSQL looks `=` up on the session's search_path. A citext column whose extension lives
in a schema off that path has no `citext = citext` in sight, so `d.id = l.id` casts both
sides to text and compares them case-sensitively, while the copy's unique key (ON CONFLICT)
and a DISTINCT ON use citext's own equality: a delete of 'ABC' then missed the row 'abc'
its key names. A statement that matches rows by key writes the operator qualified instead
(`OPERATOR(s.=)`), for every type whose equality is not one of pg_catalog's.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import psycopg
from psycopg import sql

from ...base.identifiers import TableName
from ..database import fetch_all

# The default btree operator class of each column's type (a domain's: its base type's, at
# any depth), and that class's equality (strategy 3), when it lives outside pg_catalog.
_EQUALITY = """
WITH RECURSIVE base(attname, typid, depth) AS (
    SELECT a.attname::text, a.atttypid, 0
    FROM pg_catalog.pg_attribute a
    WHERE a.attrelid = %s::regclass AND a.attname = ANY(%s) AND NOT a.attisdropped
  UNION ALL
    SELECT base.attname, t.typbasetype, base.depth + 1
    FROM base JOIN pg_catalog.pg_type t ON t.oid = base.typid
    WHERE t.typtype = 'd' AND base.depth < 32
)
SELECT base.attname, n.nspname, o.oprname
FROM base
JOIN pg_catalog.pg_type t ON t.oid = base.typid AND t.typtype <> 'd'
JOIN pg_catalog.pg_opclass c ON c.opcintype = t.oid AND c.opcdefault
JOIN pg_catalog.pg_am m ON m.oid = c.opcmethod AND m.amname = 'btree'
JOIN pg_catalog.pg_amop ao ON ao.amopfamily = c.opcfamily AND ao.amopstrategy = 3
  AND ao.amoplefttype = t.oid AND ao.amoprighttype = t.oid
JOIN pg_catalog.pg_operator o ON o.oid = ao.amopopr
JOIN pg_catalog.pg_namespace n ON n.oid = o.oprnamespace
WHERE n.nspname <> 'pg_catalog'
"""


def key_equality(
    conn: psycopg.Connection[Any], table: TableName, columns: Sequence[str]
) -> dict[str, str]:
    """`OPERATOR(schema.=)` for each of these columns whose type's equality is not one of
    pg_catalog's (the rest compare with `=`)."""
    rows = fetch_all(conn, _EQUALITY, (table.sql(), list(columns)))
    return {
        column: sql.SQL("OPERATOR({}.{})")
        .format(sql.Identifier(schema), sql.SQL(name))
        .as_string(conn)
        for column, schema, name in rows
    }
