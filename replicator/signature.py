"""A table's schema signature: what its destination table was built from.

Stored in sync-state at every load; a later run compares it to the source to decide whether
the table's shape changed.
"""

from __future__ import annotations

from typing import Any

from .catalog import Column, TableInfo


def schema_signature(
    source: TableInfo,
    columns: tuple[Column, ...],
    primary_key: tuple[str, ...],
    replication_key: str | None,
) -> dict[str, Any]:
    return {
        "table_oid": source.oid,
        "columns": [[c.name, c.type, c.not_null] for c in columns],
        "primary_key": list(primary_key),
        "replication_key": replication_key,
    }
