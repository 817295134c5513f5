"""`replicator cdc restart`: the log capture starts again from a new slot (after a lost or
dropped one: a major upgrade drops every slot; or by choice) without reloading every copy.

Every copy's position is in the old slot's stream, which means nothing in a new one. So:

1. every `cdc` copy is marked for a reload (`refresh requested`) and its position forgotten
   first: a crash anywhere below costs a reload, never a change;
2. the tool's slot is dropped (when it is still there) and made again on a replication
   connection that exports its snapshot S at its consistent point C (cdc/slot_snapshot):
   S holds exactly the commits before C, the slot every commit from C on. A DBA's slot is
   never touched: a temporary slot gives S and C, at or after the DBA slot's position, from
   which the drain reads (each table skips what its position holds);
3. with `repair`, each selected copy is compared with S by verify's range hashes and exactly
   the rows that differ are written (compare/verify_table.py, under the table's lock): the
   table stays in place and readable throughout. Then its position C is recorded and its
   mark cleared, and later runs apply every commit from C on;
4. without `repair`, for a table not selected, or one whose repair did not finish, the mark
   stays: the next sync reloads that copy.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from ...base.errors import ReplicatorError, UsageError
from ...cdc.apply.applied import ensure_applied_table, forget_applied, record_applied_step
from ...cdc.source.slot import (
    SlotInfo,
    create_slot,
    create_slot_statement,
    drop_slot,
    drop_slot_statement,
    lsn_text,
    publication_exists,
    slot_info,
)
from ...cdc.source.slot_snapshot import SlotSnapshot
from ...compare.verdict import Verdict
from ...compare.verify_table import verify_table
from ...postgres.database import Endpoints, run_steps, transaction
from ...project.cdc_state import CaptureState
from ...project.config import TableConfig
from ...project.project import Project
from ...project.state import LSN_CURSOR_TYPE, Cursor
from ...report.results import utc_now
from ...spark.runner import SparkRunner

log = logging.getLogger("replicator.cdc")

RESTARTED = "refresh requested: cdc restart (the copy's log position is in the old slot's stream)"


@dataclass(frozen=True)
class Restarted:
    """What the restart did to one copy: repaired to the new slot (`verdict` says how), or
    left for the next sync to reload (`verdict`: the repair that did not finish, if any)."""

    name: str
    reloads: bool
    verdict: Verdict | None = None


def restart_capture(
    project: Project,
    ends: Endpoints,
    selected: tuple[TableConfig, ...],
    repair: bool,
    spark: SparkRunner,
) -> tuple[str, list[Restarted]]:
    """Start the capture again; the slot's name and what became of each copy. The caller
    holds the run lock."""
    names = _names(project)
    info = _usable_slot(ends, names)
    copies = [t for t in project.config.tables if t.mode == "cdc" and _has_copy(project, t)]
    ensure_applied_table(ends.dest)
    for table in copies:  # before the old stream is let go of
        _mark(project, table)
        forget_applied(ends.dest, table.target)
    if names.created:
        drop_slot(ends.source, names.slot)
        if not repair:
            create_slot(
                ends.source, names.slot, ends.source_url, project.settings.progress_interval
            )
            return names.slot, [Restarted(t.written_name, True) for t in copies]
    elif not repair:
        return names.slot, [Restarted(t.written_name, True) for t in copies]
    chosen = {t.name for t in selected}
    with SlotSnapshot(ends.source_url, names.slot if names.created else None) as snapshot:
        log.info(
            "source: %s replication slot %s at %s",
            "made" if names.created else "kept the DBA's",
            names.slot,
            lsn_text(snapshot.lsn),
        )
        if info is not None and not names.created:
            _behind_the_slot(names, info, snapshot.lsn)
        done = [
            _repair(project, ends, t, spark, snapshot) if t.name in chosen else None for t in copies
        ]
    return names.slot, [
        r if r is not None else Restarted(t.written_name, True)
        for t, r in zip(copies, done, strict=True)
    ]


def _names(project: Project) -> CaptureState:
    names = project.capture_names()
    if names is None:
        raise UsageError(
            "no replication slot yet (sync-state/cdc.json has none): the first "
            "`replicator sync` makes one and loads the cdc tables"
        )
    return names


def _usable_slot(ends: Endpoints, names: CaptureState) -> SlotInfo | None:
    """The slot as it is, when the restart may go on: ReplicatorError (nothing touched) for
    a slot in use, a DBA's slot that is gone or lost, or a publication that is gone."""
    info = slot_info(ends.source, names.slot)
    if info is not None and info.active_pid is not None:
        raise ReplicatorError(
            f"replication slot {names.slot} is in use (process {info.active_pid}): stop the "
            "running sync (or `sync --follow`) first"
        )
    create = create_slot_statement(names.slot)
    if not names.created and (info is None or info.lost):
        fix = (
            f"create it ({create})"
            if info is None
            else f"drop it and create it again ({drop_slot_statement(names.slot)}; {create})"
        )
        raise ReplicatorError(
            f"replication slot {names.slot} (named in tables-config.json `cdc`) "
            f"{'does not exist' if info is None else 'is lost'}: it is the DBA's, replicator "
            f"never makes it: {fix}, then run `replicator cdc restart` again"
        )
    if not publication_exists(ends.source, names.publication):
        raise ReplicatorError(
            f"publication {names.publication} does not exist in the source: no slot can "
            "capture changes without it; `replicator sync` makes it (when the tool may) and "
            "a new slot, and reloads every cdc table"
        )
    return info


def _behind_the_slot(names: CaptureState, info: SlotInfo, lsn: int) -> None:
    """A DBA's slot read past the snapshot (by another reader) would skip changes."""
    if info.confirmed is not None and info.confirmed > lsn:
        raise ReplicatorError(
            f"replication slot {names.slot} has been read past {lsn_text(lsn)} (to "
            f"{lsn_text(info.confirmed)}) by another reader: the copies stay marked for a "
            "reload; give replicator a slot of its own"
        )


def _has_copy(project: Project, table: TableConfig) -> bool:
    state = project.store.read(table.name)
    return state is not None and state.last_synced_at is not None


def _mark(project: Project, table: TableConfig) -> None:
    state = project.store.read(table.name)
    assert state is not None
    update = {"pending_full_reload": True, "pending_reason": RESTARTED}
    project.store.write(state.model_copy(update=update), table.name)


def _repair(
    project: Project,
    ends: Endpoints,
    table: TableConfig,
    spark: SparkRunner,
    snapshot: SlotSnapshot,
) -> Restarted:
    """Bring one copy to the snapshot, then record its position and clear its mark."""
    state = project.store.read(table.name)
    log.info("%s: comparing with the new slot's snapshot and repairing", table.written_name)
    verdict = verify_table(
        ends,
        table,
        project.templates,
        state,
        spark,
        fix=True,
        source_snapshot=snapshot.snapshot_id,
    )
    if not verdict.fixed:
        return Restarted(table.written_name, True, verdict)
    with transaction(ends.dest):
        run_steps(ends.dest, [record_applied_step(table.target, snapshot.lsn)])
    assert state is not None
    position = Cursor(value=lsn_text(snapshot.lsn), type=LSN_CURSOR_TYPE)
    update = {
        "pending_full_reload": False,
        "pending_reason": None,
        "cursor": position,
        "last_synced_at": utc_now(),
    }
    project.store.write(state.model_copy(update=update), table.name)
    return Restarted(table.written_name, False, verdict)
