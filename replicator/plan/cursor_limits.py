"""What a replication-key cursor cannot see, said before a sync runs into it (`check`).

A cursor reads `key >= cursor`. Rows deleted in the source never pass it (README: What a
cursor cannot see), and two kinds of key make it miss or re-read rows silently:
- a key that can be NULL: no cursor orders such rows; every sync reads them all again, which
  is correct but slow when there are many;
- a `timestamp without time zone` key: wall-clock values go backwards when the source's
  TimeZone changes, or in a daylight-saving fall-back hour, and rows written then carry
  values below the cursor.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..base.identifiers import display_ident
from .table_sql import TableSql


@dataclass(frozen=True)
class Limit:
    message: str
    fix: str


def cursor_limits(
    built: TableSql, source_zone: str, key_base: str | None = None, key_not_null: bool = False
) -> list[Limit]:
    """The limits of this table's cursor, each with its fix (none for full-refresh).
    `source_zone` is the source server's default TimeZone, which local times most likely
    were written in; `key_base` the key's type under its domains, `key_not_null` whether
    one of them is NOT NULL (type_closure.domain_base)."""
    key = built.table.replication_key
    if key is None:
        return []
    name, table = display_ident(key), built.table.name
    limits = []
    if built.key_can_be_null and not key_not_null:
        limits.append(
            Limit(
                f"replication key {name} can be NULL: no cursor can order such rows, so "
                "every sync reads all of them again (merged idempotently, slow when there "
                "are many)",
                f"ALTER TABLE {table} ALTER COLUMN {name} SET NOT NULL, or a model that "
                f"coalesces it (coalesce({name}, created_at) AS {name})",
            )
        )
    if (key_base or built.replication_key_type).startswith("timestamp without time zone"):
        limits.append(
            Limit(
                f"replication key {name} is a timestamp without time zone: values written in "
                "local time go backwards when the source's TimeZone changes or in a "
                "daylight-saving fall-back hour, and the rows written then are skipped",
                f"make it timestamptz (ALTER TABLE {table} ALTER COLUMN {name} TYPE timestamptz "
                f"USING {name} AT TIME ZONE '{source_zone}', if that is the zone it was "
                f"written in), or a model that converts it ({name} AT TIME ZONE "
                f"'{source_zone}' AS {name})",
            )
        )
    return limits
