"""What to do with each table this run: a pure function of what was observed.

The reason strings start with the stable phrases the webhook contract pins (docs/guides/webhook.md).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Literal

from ..project.config import TableConfig
from ..project.state import LSN_CURSOR_TYPE, TableState

# "fail": the source schema changed and the table's on_schema_change is "fail".
# "skip_backfill": no state and initial_load "skip": start at the newest key, copy nothing.
Action = Literal["full_reload", "incremental", "fail", "skip_backfill"]


@dataclass(frozen=True)
class Plan:
    action: Action
    reason: str
    fix: str | None = None  # for "fail": what the user can do about it


def plan_table(
    mode: str,
    state: TableState | None,
    *,
    full_refresh: bool = False,
    destination_exists: bool = True,
    schema_change: str | None = None,
    destination_change: str | None = None,
    on_schema_change: str = "full_reload",
    cannot_evolve: str | None = None,
    initial_load: str = "full",
    not_owned: str | None = None,
    name: str = "<table>",
    model_change: str | None = None,
    destination_emptied: bool = False,
    destination_replaced: bool = False,
    pattern: str | None = None,
    partitions_change: str | None = None,
    taken: str | None = None,
    history_gap: str | None = None,
) -> Plan:
    """Full reload when anything says so, else incremental from the stored cursor.

    `schema_change` describes how the source differs from the stored signature (under
    on_schema_change "evolve", `cannot_evolve` says why the copy cannot take it in place);
    `model_change` how the model's SQL differs from the one the copy was loaded with (the
    user's own change: on_schema_change does not apply); `destination_emptied`: the copy
    held rows at its last sync and holds none now (a TRUNCATE there): no cursor would bring
    them back; `destination_replaced`: the table there is not the one the last sync wrote;
    `partitions_change`: leaves of a partitioned table came or went in a way no run reads
    (plan/partition_change.py); `destination_change` how the destination table differs from
    what the tool created;
    `not_owned` is the fix when the destination table exists but is not the tool's: only a
    start without backfill (which adopts a matching table) may touch it; `taken` the fix
    when it is the copy another project keeps: nothing may; `history_gap` why the table's
    history table lacks versions the syncs since its last one would have written (dropped,
    or not kept by the last sync). `name` is the table
    as the config writes it, for the fixes; `pattern` the pattern that chose it, if one did."""
    plan = _plan(
        mode,
        state,
        full_refresh,
        destination_exists,
        schema_change,
        destination_change,
        on_schema_change,
        initial_load,
        name,
        cannot_evolve,
    )
    if pattern is not None and plan.reason == "no state":
        plan = Plan("full_reload", f"no state: new table matched {pattern}")
    if plan.action == "incremental" and model_change:
        plan = Plan("full_reload", model_change)
    if plan.action == "incremental" and partitions_change:
        plan = Plan("full_reload", f"partitions changed: {partitions_change}")
    if plan.action == "incremental" and destination_replaced:
        plan = Plan(
            "full_reload",
            "destination table replaced: another table than the one the last sync wrote is "
            "there (the destination switched back to an older copy, or another load replaced "
            "it); its rows are not the cursor's",
        )
    if plan.action == "incremental" and history_gap is not None:
        plan = Plan(
            "full_reload",
            f"{history_gap}: the reload begins its versions from the copy's rows, and "
            "keeps what the history has",
        )
    if plan.action == "incremental" and destination_emptied:
        plan = Plan(
            "full_reload",
            "destination table emptied: it held rows at the last sync and holds none now "
            "(a TRUNCATE or DELETE there); no cursor brings them back",
        )

    if taken is not None:
        return Plan("fail", "destination table is the copy another replicator project keeps", taken)
    if not_owned is not None and plan.action != "skip_backfill":
        return Plan("fail", "destination table exists and was not created by replicator", not_owned)
    return plan


def _plan(
    mode: str,
    state: TableState | None,
    full_refresh: bool,
    destination_exists: bool,
    schema_change: str | None,
    destination_change: str | None,
    on_schema_change: str,
    initial_load: str,
    name: str,
    cannot_evolve: str | None = None,
) -> Plan:
    if mode == "full-refresh":
        return Plan("full_reload", "mode full-refresh")
    if full_refresh:
        return Plan("full_reload", "--full-refresh")
    if state is not None and state.pending_full_reload:  # `refresh`, or a reason the run found
        return Plan("full_reload", state.pending_reason or "refresh requested")
    if state is None or state.last_synced_at is None:
        if initial_load == "skip":
            return Plan("skip_backfill", "no state: initial_load skip")
        return Plan("full_reload", "no state")
    if not destination_exists:
        return Plan("full_reload", "destination table missing")
    if mode == "cdc" and not _log_position(state):  # the user's own change: reload, not fail
        return Plan("full_reload", "mode changed to cdc: the copy has no log position")
    if schema_change:
        if on_schema_change == "fail":
            return Plan(
                "fail",
                f"schema changed: {schema_change}",
                'on_schema_change is "fail": review the change, then reload the table with '
                f"`replicator sync -f -s {name}`",
            )
        if on_schema_change == "evolve" and cannot_evolve is None and not destination_change:
            return Plan("incremental", f"schema evolved: {schema_change}")
        if on_schema_change == "evolve":
            why = cannot_evolve or f"the destination table was altered: {destination_change}"
            return Plan("full_reload", f"schema changed: {schema_change} (cannot evolve: {why})")
        return Plan("full_reload", f"schema changed: {schema_change}")
    if destination_change:
        return Plan("full_reload", f"destination table altered: {destination_change}")
    if state.cursor is None:  # the last load found the source table empty
        return Plan("incremental", "cursor none (source was empty)")
    if state.cursor.value.lower() in _NOT_FINITE:  # set by hand (--force): no row is above it
        return Plan("full_reload", f"cursor {state.cursor.value}: no later row could be read")
    return Plan("incremental", f"cursor {state.cursor.value}")


# A cursor no key can pass: a sync never stores one (plan/cursor.finite_test), a hand may.
_NOT_FINITE = frozenset(("infinity", "nan"))


def _log_position(state: TableState | None) -> bool:
    """Whether a `cdc` table's state holds a log position (a table whose mode was switched
    to cdc has a cursor, or none, from its earlier mode: it is loaded again from a slot)."""
    return state is not None and state.cursor is not None and state.cursor.type == LSN_CURSOR_TYPE


def delete_check_due(table: TableConfig, state: TableState | None) -> bool:
    """The interval since the last delete check has passed (none set: every sync)."""
    if table.deletes == "ignore":
        return False
    if table.deletes_interval == 0:
        return True
    last = state.deletes_checked_at if state else None
    if last is None:
        return True
    elapsed = datetime.now(UTC) - datetime.fromisoformat(last.replace("Z", "+00:00"))
    return elapsed.total_seconds() >= table.deletes_interval
