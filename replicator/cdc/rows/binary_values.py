"""Whether a drain asks the source for values in their types' binary form (pgoutput's
`binary`, PostgreSQL 14 and later), which COPY's binary format takes as they are: the
walsender skips each type's text output and the destination its parsing (the staging
COPYs a third faster: bench/RESULTS.md), and nothing is escaped on the way.

A binary value is only read right as the type that wrote it, and arrays name their element
type by OID: so every table the drain stages must have only the built-in types below, of the
same type in the copy as in the source (a copy altered by hand to another type stays on
text, which the type's input reads or refuses), and no `columns` shaping (`hash` hashes the
text form). The destination must run the source's major version or a later one: a type's
binary form may gain values a release's receive function did not know (infinite intervals
in PostgreSQL 17). Otherwise the whole drain reads text, as before: one stream serves every
table.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import psycopg

from ...postgres.database import execute
from ..capture_table import CaptureTable

MIN_SERVER = 140000  # pgoutput's `binary` option
# Built-in types (their OIDs are fixed) whose binary form holds no other type's OID, and
# arrays of them (whose binary form names the element type, the same on both servers).
# tests/test_binary_values.py checks the names against a server's catalog.
BINARY_TYPES = {
    16: "bool", 17: "bytea", 18: "char", 19: "name", 20: "int8", 21: "int2", 23: "int4",
    25: "text", 26: "oid", 114: "json", 650: "cidr", 700: "float4", 701: "float8",
    774: "macaddr8", 829: "macaddr", 869: "inet", 1042: "bpchar", 1043: "varchar",
    1082: "date", 1083: "time", 1114: "timestamp", 1184: "timestamptz", 1186: "interval",
    1266: "timetz", 1560: "bit", 1562: "varbit", 1700: "numeric", 2950: "uuid",
    3220: "pg_lsn", 3802: "jsonb",
    199: "_json", 651: "_cidr", 1000: "_bool", 1001: "_bytea", 1005: "_int2", 1007: "_int4",
    1009: "_text", 1014: "_bpchar", 1015: "_varchar", 1016: "_int8", 1021: "_float4",
    1022: "_float8", 1041: "_inet", 1115: "_timestamp", 1182: "_date", 1183: "_time",
    1185: "_timestamptz", 1187: "_interval", 1231: "_numeric", 1270: "_timetz",
    2951: "_uuid", 3807: "_jsonb",
}  # fmt: skip

_DEST_TYPES = """
SELECT t.name, a.attname, a.atttypid::int
FROM unnest(%s::text[]) AS t(name)
JOIN pg_catalog.pg_attribute AS a
  ON a.attrelid = to_regclass(t.name) AND a.attnum > 0 AND NOT a.attisdropped
"""


def binary_values(
    source: psycopg.Connection[Any], dest: psycopg.Connection[Any], tables: Sequence[CaptureTable]
) -> bool:
    """Whether the drain of `tables` reads binary values (see above)."""
    staged = [t for t in tables if t.takes_changes and t.built is not None]
    if not staged or source.info.server_version < MIN_SERVER:
        return False
    if dest.info.server_version // 10000 < source.info.server_version // 10000:
        return False  # a newer source's send may write what an older receive misreads
    if any(t.shaping is not None for t in staged):
        return False
    source_types = {(str(t.target), name): oid for t in staged for name, oid in t.column_types}
    if any(oid not in BINARY_TYPES for oid in source_types.values()):
        return False
    names = {t.target.identifier().as_string(dest): str(t.target) for t in staged}
    dest_types = {
        (names[name], column): oid
        for name, column, oid in execute(dest, _DEST_TYPES, (list(names),)).fetchall()
    }
    return all(dest_types.get(column) == oid for column, oid in source_types.items())
