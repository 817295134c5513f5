"""`replicator cdc drop`: remove the project's replication slot and publication from the
source, so an abandoned project stops holding WAL there. The `cdc` tables then reload in
full at their next sync (from a new slot), which their sync-state says."""

from __future__ import annotations

from ..base.errors import ReplicatorError
from ..capture.slot import (
    drop_publication,
    drop_publication_statement,
    drop_slot,
    drop_slot_statement,
    slot_info,
)
from ..postgres.database import connect
from ..project.capture_state import forget_capture_state, read_capture_state
from ..project.project import Project
from ..project.runlock import run_lock
from ..report.logs import say
from ..sync.capture_setup import SLOT_DROPPED as DROPPED


def drop_capture(project: Project) -> int:
    with run_lock(project.state_dir):
        names = read_capture_state(project.state_dir)
        if names is None:
            say("no replication slot recorded in sync-state/cdc.json: nothing to drop", "cdc.drop")
            return 0
        if not names.created:
            raise ReplicatorError(
                f"replication slot {names.slot} and publication {names.publication} were made "
                'by a DBA (tables-config.json `cdc`, "create": false): replicator leaves them; '
                f"drop them in the source with {drop_slot_statement(names.slot)} and "
                f"{drop_publication_statement(names.publication)}"
            )
        with connect(project.connections().source, "source") as source:
            info = slot_info(source, names.slot)
            if info is not None and info.active_pid is not None:
                raise ReplicatorError(
                    f"replication slot {names.slot} is in use (process {info.active_pid}): "
                    "stop the running sync (or `sync --follow`) first"
                )
            slot = drop_slot(source, names.slot)
            publication = drop_publication(source, names.publication)
        for table in project.config.tables:
            state = project.store.read(table.name)
            if table.mode == "cdc" and state is not None:
                project.store.write(
                    state.model_copy(
                        update={"pending_full_reload": True, "pending_reason": DROPPED}
                    ),
                    table.name,
                )
        forget_capture_state(project.state_dir)
    say(
        f"dropped replication slot {names.slot}{'' if slot else ' (it was already gone)'} and "
        f"publication {names.publication}{'' if publication else ' (it was already gone)'}; "
        "the cdc tables reload in full at their next sync",
        "cdc.drop",
        slot=names.slot,
        publication=names.publication,
    )
    return 0
