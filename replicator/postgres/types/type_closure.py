"""The user-defined types a table's columns use, read from one catalog: the columns' own
types and everything they are built on (array elements, domain bases, composite attributes,
range subtypes, a multirange's range), deepest first.

A type that belongs to an extension (pg_depend deptype 'e') is the extension's to create:
`extension` names it, and such a type is never created by hand (dest_extensions.py).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import psycopg

from ..database import execute, fetch_all, transaction

# The types whose rows a load copies in COPY's text form, not its binary one (with arrays):
# - the object identifier types (regclass, regtype, ...): the binary form is the object's
#   OID, which names another object, or none, in another database; the text form its name;
# - tsquery, int2vector and oidvector: their binary input refuses the empty value their
#   binary output writes; aclitem has no binary form at all.
TEXT_COPIED_TYPES = frozenset(
    {24, 1008, 2202, 2203, 2204, 2205, 2206, 2207, 2208, 2209, 2210, 2211}
    | {3734, 3735, 3769, 3770, 4089, 4090, 4096, 4097, 4191, 4192}
    | {3615, 3645, 22, 1006, 30, 1013, 1033, 1034}
)

# Every object made after initdb (a user's type, an extension's) has an OID from here on:
# a column of a built-in type needs no look at the catalog.
FIRST_NORMAL_OID = 16384

# The types a type is built on: an array's element, a domain's base, a composite's
# attributes, a range's subtype, a multirange's range (`ty` is the type's pg_type row).
_BUILT_ON = """
        SELECT ty.typelem AS oid WHERE ty.typcategory = 'A' AND ty.typelem <> 0
        UNION ALL SELECT ty.typbasetype WHERE ty.typtype = 'd'
        UNION ALL SELECT a.atttypid FROM pg_catalog.pg_attribute a
                  WHERE ty.typtype = 'c' AND a.attrelid = ty.typrelid
                    AND a.attnum > 0 AND NOT a.attisdropped
        UNION ALL SELECT r.rngsubtype FROM pg_catalog.pg_range r WHERE r.rngtypid = ty.oid
        UNION ALL SELECT r.rngtypid FROM pg_catalog.pg_range r WHERE r.rngmultitypid = ty.oid
"""

_CLOSURE = f"""
WITH RECURSIVE used(col, oid, depth) AS (
    SELECT c.col, c.oid, 0 FROM unnest(%s::text[], %s::oid[]) AS c(col, oid)
  UNION ALL
    SELECT used.col, dep.oid, used.depth + 1
    FROM used JOIN pg_catalog.pg_type ty ON ty.oid = used.oid
    CROSS JOIN LATERAL ({_BUILT_ON}) dep
    WHERE used.depth < 32
)
SELECT oid, nspname, typname, typtype, creatable, extname, extversion,
       array_agg(DISTINCT col ORDER BY col), max(depth) AS depth
FROM (
    SELECT ty.oid, n.nspname, ty.typname, ty.typtype, x.extname, x.extversion, used.col,
           used.depth,
           n.nspname NOT IN ('pg_catalog', 'information_schema')
           AND (ty.typtype IN ('e', 'd', 'r')
                OR (ty.typtype = 'c' AND (SELECT relkind FROM pg_catalog.pg_class
                                          WHERE oid = ty.typrelid) = 'c')) AS creatable
    FROM used
    JOIN pg_catalog.pg_type ty ON ty.oid = used.oid
    JOIN pg_catalog.pg_namespace n ON n.oid = ty.typnamespace
    LEFT JOIN LATERAL (
        SELECT e.extname, e.extversion
        FROM pg_catalog.pg_depend d JOIN pg_catalog.pg_extension e ON e.oid = d.refobjid
        WHERE d.classid = 'pg_catalog.pg_type'::pg_catalog.regclass AND d.objid = ty.oid
          AND d.refclassid = 'pg_catalog.pg_extension'::pg_catalog.regclass
          AND d.deptype = 'e'
    ) x ON true
) found
WHERE creatable OR extname IS NOT NULL
GROUP BY oid, nspname, typname, typtype, creatable, extname, extversion
ORDER BY depth DESC, oid
"""


@dataclass(frozen=True)
class UsedType:
    """A user-defined type some columns use, directly or through another type."""

    oid: int
    schema: str
    name: str
    kind: str  # pg_type.typtype: 'e' enum, 'd' domain, 'c' composite, 'r' range, 'b' base...
    creatable: bool  # an enum, domain, range or free-standing composite (not a row type)
    extension: str | None  # the extension it belongs to, if any
    extension_version: str | None
    columns: tuple[str, ...]  # the columns that use it

    @property
    def qualified(self) -> str:
        return f"{self.schema}.{self.name}"


def read_closure(
    conn: psycopg.Connection[Any], columns: Iterable[tuple[str, int]]
) -> list[UsedType]:
    """The types behind these (column name, type oid) pairs, deepest first; built-in types
    are left out, extension types are in wherever they live."""
    pairs = sorted(set(columns))
    if all(oid < FIRST_NORMAL_OID for _, oid in pairs):
        return []  # built-in types only: made by initdb, never a user's or an extension's
    with transaction(conn):
        execute(conn, "SET LOCAL search_path = pg_catalog, pg_temp")
        rows = fetch_all(conn, _CLOSURE, ([p[0] for p in pairs], [p[1] for p in pairs]))
    return [UsedType(*row[:7], tuple(row[7])) for row in rows]


_BASE = """
WITH RECURSIVE chain(oid, base) AS (
    SELECT t.oid, t.typbasetype FROM pg_catalog.pg_type t WHERE t.oid = %s::regtype
  UNION ALL
    SELECT t.oid, t.typbasetype FROM pg_catalog.pg_type t JOIN chain ON t.oid = chain.base
)
SELECT pg_catalog.format_type(oid, NULL),
       (SELECT bool_or(t.typnotnull) FROM pg_catalog.pg_type t
        WHERE t.oid IN (SELECT c.oid FROM chain c))
FROM chain WHERE base = 0
"""


_STAGED = """
WITH RECURSIVE chain(base, typmod, depth) AS (
    SELECT t.typbasetype, t.typtypmod, 0 FROM pg_catalog.pg_type t
    WHERE t.oid = %s AND t.typtype = 'd'
  UNION ALL
    SELECT t.typbasetype, t.typtypmod, chain.depth + 1
    FROM pg_catalog.pg_type t JOIN chain ON t.oid = chain.base
    WHERE t.typtype = 'd'
)
SELECT pg_catalog.format_type(base, typmod) FROM chain ORDER BY depth DESC LIMIT 1
"""


def staged_base(conn: psycopg.Connection[Any], type_oid: int) -> str | None:
    """The type a domain column is staged as by a cdc drain (cdc/rows/stage.py): the innermost
    domain's base type with its modifier; None for a type that is no domain."""
    row = execute(conn, _STAGED, (type_oid,)).fetchone()
    return str(row[0]) if row else None


def domain_base(conn: psycopg.Connection[Any], type_text: str) -> tuple[str, bool]:
    """The type a domain stands on, through domains over domains (a `timestamptz` for a
    domain over it): what its values can be (`infinity`) and how they subtract; and whether
    one of the domains is NOT NULL. Any other type is its own, nullable; a built-in one
    (catalog.Column prints only user-defined types schema-qualified) needs no catalog."""
    if "." not in type_text:
        return type_text, False
    row = execute(conn, _BASE, (type_text,)).fetchone()
    return (str(row[0]), bool(row[1])) if row else (type_text, False)


def base_type(conn: psycopg.Connection[Any], type_text: str) -> str:
    """domain_base's type."""
    return domain_base(conn, type_text)[0]


_HOLDS = f"""
WITH RECURSIVE used(oid, depth) AS (
    SELECT c.oid, 0 FROM unnest(%s::oid[]) AS c(oid)
  UNION
    SELECT dep.oid, used.depth + 1
    FROM used JOIN pg_catalog.pg_type ty ON ty.oid = used.oid
    CROSS JOIN LATERAL ({_BUILT_ON}) dep
    WHERE used.depth < 32
)
SELECT EXISTS (SELECT FROM used WHERE used.oid = ANY(%s::oid[]))
"""


def holds_text_copied(conn: psycopg.Connection[Any], oids: Iterable[int]) -> bool:
    """Whether a value of one of these types is, or holds, one of TEXT_COPIED_TYPES (a domain
    over regclass, an array of one, a composite with a tsquery attribute...)."""
    wanted = set(oids)
    if wanted & TEXT_COPIED_TYPES:
        return True
    built = sorted(oid for oid in wanted if oid >= FIRST_NORMAL_OID)
    if not built:  # a built-in type is built on built-in ones only
        return False
    (holds,) = execute(conn, _HOLDS, (built, sorted(TEXT_COPIED_TYPES))).fetchone()
    return bool(holds)
