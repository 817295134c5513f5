"""What a run observes of a table besides its config and state: its signature now, its
destination table, and how both drifted from the signature stored at the last load."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import psycopg

from .catalog import TableInfo, describe_table
from .config import TableConfig
from .plan import Plan, plan_table
from .schema_diff import Change, describe, diff
from .signature import Signature, destination_signature, read_signature
from .state import TableState
from .table_sql import TableSql


@dataclass(frozen=True)
class Observed:
    """What one run saw of a table besides its config and state."""

    signature: Signature
    destination: TableInfo | None
    schema_changes: tuple[Change, ...]  # the source against the stored signature
    destination_changes: tuple[Change, ...]  # the destination table against it

    @property
    def schema_change(self) -> str | None:
        return describe(list(self.schema_changes)) or None

    @property
    def destination_change(self) -> str | None:
        return describe(list(self.destination_changes)) or None


def observe(
    source_conn: psycopg.Connection[Any],
    dest_conn: psycopg.Connection[Any] | None,
    table: TableConfig,
    built: TableSql,
    source: TableInfo,
    state: TableState | None,
) -> Observed:
    """The source's signature now, the destination table, and how both drifted (the
    destination is not looked at without a connection to it)."""
    signature = read_signature(source_conn, source, built)
    destination = describe_table(dest_conn, table.target) if dest_conn is not None else None
    schema_changes: list[Change] = []
    destination_changes: list[Change] = []
    stored = state.schema_signature if state else None
    if stored and table.mode != "full-refresh":
        before = Signature.from_json(stored)
        schema_changes = diff(before, signature)
        if destination is not None:
            destination_changes = diff(before.as_created(), destination_signature(destination))
    return Observed(signature, destination, tuple(schema_changes), tuple(destination_changes))


def plan_observed(
    table: TableConfig,
    state: TableState | None,
    observed: Observed,
    full_refresh: bool = False,
    *,
    destination_known: bool = True,
) -> Plan:
    """The table's plan from its config, state and what the run observed (a destination
    that was not looked at counts as present)."""
    return plan_table(
        table.mode or "",
        state,
        full_refresh=full_refresh,
        destination_exists=observed.destination is not None or not destination_known,
        schema_change=observed.schema_change,
        destination_change=observed.destination_change,
        on_schema_change=table.on_schema_change or "full_reload",
        initial_load=table.initial_load,
    )
