"""How much WAL the source keeps for the project's slots: the metrics' figure alone (the
warnings about it are `check`'s and `status`'s)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import psycopg

from ...postgres.database import fetch_all


def retained_wal_bytes(source: psycopg.Connection[Any], slots: Sequence[str]) -> dict[str, int]:
    """By slot name, `pg_current_wal_lsn() - restart_lsn` in bytes (0 for a slot that holds
    none); a slot that does not exist is left out."""
    rows = fetch_all(
        source,
        "SELECT slot_name, coalesce(pg_current_wal_lsn() - restart_lsn, 0) "
        "FROM pg_catalog.pg_replication_slots WHERE slot_name = ANY(%s)",
        (list(slots),),
    )
    return {name: max(int(size), 0) for name, size in rows}
