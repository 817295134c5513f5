"""Whether the project's slot is safe, as `sync` and `status` both say it (one text): a
slot that retains more WAL than `cdc.max_retained_wal`, or that the source already counts
past `max_slot_wal_keep_size` (`wal_status` unreserved: its WAL goes at the next
checkpoint), is a warning; a lost slot (its WAL removed) is an error: no copy can go on
from it without a gap, so the sync reloads every `cdc` table and exits 1."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import psycopg

from ...postgres.database import fetch_all
from .slot import SlotInfo, create_slot_statement, drop_slot_statement

RESTART = "replicator cdc restart --repair"


@dataclass(frozen=True)
class SlotAlarm:
    lost: bool  # the run reloads its cdc tables and exits 1; else `text` is a warning
    text: str


def size_text(size: int) -> str:
    for unit, scale in (("GB", 1 << 30), ("MB", 1 << 20), ("kB", 1 << 10)):
        if size >= scale:
            return f"{size / scale:,.1f} {unit}"
    return f"{size} bytes"


def lost_text(slot: str) -> str:
    return (
        f"replication slot {slot} is lost (wal_status lost): the source removed WAL the slot "
        "still needed (it kept more than max_slot_wal_keep_size), so the changes in it are "
        "gone: a sync makes a new slot and reloads every cdc table (reason slot lost) and "
        f"exits 1; to keep the copies in place instead, run `{RESTART}` before the next sync "
        "(a new slot, only the rows that differ written)"
    )


def dba_slot_text(slot: str, lost: bool) -> str:
    """A slot a DBA made (`cdc.create` false) that is missing or lost: the tool may not make
    it again, so every sync fails its `cdc` tables until the DBA does (`sync` and `status`
    say the same)."""
    create = create_slot_statement(slot)
    if lost:
        problem = "is lost (its WAL was removed)"
        fix = f"drop it and create it again ({drop_slot_statement(slot)}; {create})"
    else:
        problem, fix = "does not exist", f"create it ({create})"
    return (
        f"replication slot {slot} (named in tables-config.json `cdc`) {problem}: every sync "
        f"fails the cdc tables until a DBA does: {fix}; the next sync then reloads every cdc "
        f"table (`{RESTART}` first keeps the copies instead)"
    )


def slot_alarm(info: SlotInfo, limit_bytes: int, limit_text: str) -> SlotAlarm | None:
    """What to say about the slot; None when nothing."""
    if info.lost:
        return SlotAlarm(True, lost_text(info.name))
    retains = f"replication slot {info.name} retains {size_text(info.retained_bytes)} of WAL"
    if info.wal_status == "unreserved":
        return SlotAlarm(
            False,
            f"{retains}, past the source's max_slot_wal_keep_size (wal_status unreserved): "
            "the source removes it at its next checkpoint and the slot is then lost; sync "
            "every cdc table now and more often, or raise max_slot_wal_keep_size",
        )
    if info.retained_bytes > limit_bytes:
        return SlotAlarm(
            False,
            f"{retains}, over cdc.max_retained_wal ({limit_text}): the source keeps it until "
            "every cdc table's changes are read; sync every cdc table more often, raise "
            "cdc.max_retained_wal, or drop an abandoned slot with `replicator cdc drop`",
        )
    return None


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
