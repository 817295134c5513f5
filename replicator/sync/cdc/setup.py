"""Log capture's set-up, once per run (sync/cdc/cdc_run.py): the slot and publication
names (sync-state/cdc.json), every copy whose position no longer holds marked for a reload
(a slot that changed, was lost or made again; a table back in the config), the publication
listing the `cdc` tables, and the slot (created when missing)."""

from __future__ import annotations

import logging
import shlex
from collections.abc import Collection, Mapping

import psycopg

from ...base.errors import ReplicatorError, TableProblem
from ...base.identifiers import TableName
from ...cdc.apply.applied import ensure_applied_table, forget_applied
from ...cdc.preflight import (
    applied_where,
    capture_problem,
    refused_in_publication,
    refuses_changes,
    replica_identity,
)
from ...cdc.source.log_filter import PublishedAs, published_as
from ...cdc.source.slot import (
    PLUGIN,
    create_slot,
    drop_publication,
    drop_publication_statement,
    drop_slot,
    drop_slot_statement,
    ensure_publication,
    slot_info,
    wal_level_problem,
    wrong_plugin,
)
from ...cdc.source.slot_health import dba_slot_text, lost_text
from ...plan.drift import Planned
from ...plan.inspect_table import inspect_source
from ...postgres.database import Endpoints
from ...project.cdc_state import (
    CaptureState,
    read_capture_state,
    rejoin_mark,
    resolve_names,
    write_capture_state,
)
from ...project.config import TableConfig
from ...project.project import Project
from ...project.state import LSN_CURSOR_TYPE, TableState

log = logging.getLogger("replicator.sync")

SLOT_LOST = "slot lost"
SLOT_DROPPED = "slot dropped"  # what `cdc drop` says too


def _warn_abandoned(stored: CaptureState | None, names: CaptureState) -> None:
    """The config renamed what this project made: the old slot would keep WAL forever."""
    if stored is None or not stored.created:
        return
    if stored.slot != names.slot:
        log.warning(
            "source: replication slot %s (made by this project) is no longer used and keeps "
            "WAL until dropped: %s",
            stored.slot,
            drop_slot_statement(stored.slot),
        )
    if stored.publication != names.publication:
        log.warning(
            "source: publication %s (made by this project) is no longer used: %s",
            stored.publication,
            drop_publication_statement(stored.publication),
        )


def _in_the_log(state: TableState | None) -> bool:
    """Whether a table's copy goes on from a log position (a table just switched to cdc
    has none: it loads from a slot snapshot anyway)."""
    return state is not None and state.cursor is not None and state.cursor.type == LSN_CURSOR_TYPE


def set_up_capture(
    project: Project,
    ends: Endpoints,
    selected: tuple[TableConfig, ...],
    planned: Mapping[TableName, Planned],
) -> tuple[CaptureState, str | None]:
    """Names, publication and slot, ready for the run's drain, and what to say of the tool's
    slot when it was found lost and made again (its copies reload; the run exits 1);
    ReplicatorError (or a database error) when they cannot be, which fails every selected
    `cdc` table. `planned`: the selected tables' plans (a table without one is inspected
    here)."""
    problem = wal_level_problem(ends.source)
    if problem is not None:
        raise TableProblem(problem)
    every = [t for t in project.config.tables if t.mode == "cdc"]
    selected = tuple(t for t in selected if t.mode == "cdc")
    stored = read_capture_state(project.state_dir)
    names = resolve_names(project.config.cdc, stored)
    ensure_applied_table(ends.dest)
    if stored is not None and stored.slot != names.slot:
        # The copies' positions are in the old slot's stream: the new one holds none of
        # the changes in between (marked before the new name is written).
        changed = f"replication slot changed: {stored.slot} -> {names.slot}"
        _mark_every_table_for_reload(project, every, changed)
    _rejoined(project, ends, names, every)
    followed = tuple(str(t.name) for t in every)
    if names != stored or names.tables != followed:
        _warn_abandoned(stored, names)
        names = names.model_copy(update={"tables": followed})
        write_capture_state(project.state_dir, names)
    listed = {t.name: _listing(project, ends, t, planned.get(t.name)) for t in selected}
    listings = {name: listing for name, (listing, _) in listed.items()}
    ready = [name for name, listing in listings.items() if listing is not None]
    # A table the source would refuse UPDATEs of while published (a partition created
    # without a replica identity) leaves the publication: the application must go on.
    refused = {name for name, (_, refuses) in listed.items() if refuses}
    refused |= _refused_unselected(ends, names, every, listed)
    keep = {t.name for t in every} - refused
    targets = {t.name: t.target for t in selected}

    def forget(joining: list[TableName]) -> None:
        for name in joining:  # a table back in the publication missed changes
            forget_applied(ends.dest, targets[name])

    given = {name: listing for name, listing in listings.items() if listing is not None}
    published_now = ensure_publication(ends.source, names, ready, keep, forget, given)
    described = {str(name): listing.describe() for name, listing in given.items()}
    if names.created and described != {k: v for k, v in names.listings.items() if k in described}:
        names = names.model_copy(update={"listings": {**names.listings, **described}})
        write_capture_state(project.state_dir, names)
    try:
        lost = _ensure_slot(project, ends, names, published_now, every)
    except (ReplicatorError, psycopg.Error):
        if published_now:  # made for a slot that could not be: not left behind
            drop_publication(ends.source, names.publication)
        raise
    return names, lost


def _refused_unselected(
    ends: Endpoints, names: CaptureState, every: list[TableConfig], selected: Collection[TableName]
) -> set[TableName]:
    """The config's other `cdc` tables in the tool's publication whose UPDATEs the source
    now refuses (a partition created without a replica identity): they leave it on a run
    that does not select them too, said as a warning; each reloads when it is back."""
    if not names.created:
        return set()  # a DBA's publication is theirs to change
    config = {t.name for t in every} - set(selected)
    found = refused_in_publication(ends.source, names.publication)
    for name, why in found.items():
        if name in config:
            log.warning(
                "%s: %s: the source refuses its UPDATEs and DELETEs while it is published, "
                "so it leaves the tool's publication (its copy reloads once it is back: %s)",
                name,
                why,
                f"give it a replica identity, then `replicator sync -s {shlex.quote(str(name))}`",
            )
    return {name for name in found if name in config}


def _rejoined(
    project: Project, ends: Endpoints, names: CaptureState, every: list[TableConfig]
) -> None:
    """Tables back among the config's `cdc` tables since the slot was last read: the slot
    moved on without them (a DBA's publication still listed them, but no run applied
    their changes), so each copy reloads instead of going on from its old position.
    Marked, then its position forgotten, before the new list is written: a crash in
    between marks it again."""
    store = project.store
    for table in every:
        marked = rejoin_mark(names, table, store.read(table.name))
        if marked is not None:
            store.write(marked, table.name)
            forget_applied(ends.dest, table.target)


def _listing(
    project: Project, ends: Endpoints, table: TableConfig, planned: Planned | None
) -> tuple[PublishedAs | None, bool]:
    """How the table joins the publication (its column list and row filter); None when it
    may not (run.py reports why, later), with whether the source would then refuse its (or
    a partition's) UPDATEs while it is published."""
    try:
        if planned is not None:
            info, built = planned.source, planned.built
        else:
            info, built = inspect_source(ends.source, table, project.templates)
        if capture_problem(ends.source, info, built, project.cdc_tables) is not None:
            return None, refuses_changes(ends.source, info)
        shaping = built.shaping
        if shaping is None:
            return PublishedAs(alone=info.has_children), False
        identity, _ = replica_identity(ends.source, info)
        listed = bool(shaping.include)
        # a `where` the apply runs is no row filter: the publication sends every row
        where = None if applied_where(ends.source, info, built) else shaping.where
        return published_as(identity, info, shaping.exclude, where, listed), False
    except (ReplicatorError, psycopg.Error):
        return None, False


def _ensure_slot(
    project: Project,
    ends: Endpoints,
    names: CaptureState,
    published_now: bool,
    every: list[TableConfig],
) -> str | None:
    """The slot exists and is usable. One (re)created while copies existed marks them for a
    reload first (a crash after that loses nothing). Returns the text of a lost slot made
    again, else None."""
    info = slot_info(ends.source, names.slot)
    if info is not None and info.plugin != PLUGIN:
        raise TableProblem(wrong_plugin(info))
    if info is not None and not info.lost and not published_now:
        return None
    if not names.created:
        # Whatever slot the DBA makes next starts later than the copies' positions: the
        # changes in between are in no slot, so every copy reloads (marked first).
        _mark_every_table_for_reload(project, every)
        raise TableProblem(dba_slot_text(names.slot, lost=info is not None))
    store = project.store
    reset = info is not None or any(_in_the_log(store.read(t.name)) for t in every)
    if reset:  # a slot lost, dropped outside the tool, or older than its publication
        _mark_every_table_for_reload(project, every, SLOT_DROPPED if info is None else SLOT_LOST)
    lost = lost_text(names.slot) if info is not None and info.lost else None
    if info is not None:
        if lost is not None:  # no copy goes on from it without a gap: the run exits 1
            log.error("source: %s: making it again", lost)
        else:
            log.warning(
                "source: replication slot %s is older than its publication: making it again",
                names.slot,
            )
        drop_slot(ends.source, names.slot)
    create_slot(ends.source, names.slot, ends.source_url, project.settings.progress_interval)
    return lost


def _mark_every_table_for_reload(
    project: Project, every: list[TableConfig], reason: str = SLOT_LOST
) -> None:
    store = project.store
    for table in every:
        state = store.read(table.name)
        if state is not None and state.last_synced_at and not state.pending_full_reload:
            store.write(
                state.model_copy(update={"pending_full_reload": True, "pending_reason": reason}),
                table.name,
            )
