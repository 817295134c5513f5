"""`replicator cdc drop`: remove the project's replication slot and publication from the
source, so an abandoned project stops holding WAL there. The `cdc` tables then reload in
full at their next sync (from a new slot), which their sync-state says.

`replicator cdc restart [--repair]`: a new slot, with the copies repaired to its snapshot
or marked to reload (sync/cdc/restart.py)."""

from __future__ import annotations

from ..base.errors import ReplicatorError, UsageError
from ..cdc.source.slot import (
    drop_publication,
    drop_publication_statement,
    drop_slot,
    drop_slot_statement,
    slot_info,
)
from ..postgres.database import Endpoints, connect
from ..postgres.table_lock import lock_connections
from ..project.cdc_state import forget_capture_state, read_capture_state
from ..project.project import Project
from ..project.runlock import run_lock
from ..report.logs import say
from ..spark.runner import SparkRunner
from ..sync.cdc.restart import Restarted, restart_capture
from ..sync.cdc.setup import SLOT_DROPPED as DROPPED


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


def restart_capture_command(
    project: Project, names: tuple[str, ...], repair: bool, verbose: int
) -> int:
    """`cdc restart`: exit 0 when every copy was brought to the new slot as asked (repaired,
    or left to reload), 1 when a repair did not finish (that copy reloads at the next sync)."""
    selected = project.select(names)
    others = [t.written_name for t in selected if t.mode != "cdc"]
    if names and others:
        raise UsageError(f"{', '.join(others)}: not a cdc table; `cdc restart -s` names cdc tables")
    if names and not repair:
        raise UsageError(
            "-s chooses the tables --repair brings to the new slot (the others reload): "
            "`replicator cdc restart --repair -s T`"
        )
    connections = project.connections()
    spark = SparkRunner.for_run(project.settings, verbose)
    with (
        run_lock(project.state_dir),
        lock_connections(),
        connect(connections.source, "source") as source,
        connect(connections.destination, "destination") as dest,
    ):
        ends = Endpoints(source, dest, connections.source, connections.destination)
        try:
            slot, outcomes = restart_capture(project, ends, selected, repair, spark)
        finally:
            spark.finish()
    for outcome in outcomes:
        say(_outcome_line(outcome), "cdc.restart", table=outcome.name, reloads=outcome.reloads)
    say(f"cdc: replication slot {slot} restarted", "cdc.restart", slot=slot)
    return 1 if any(o.verdict is not None and o.reloads for o in outcomes) else 0


def _outcome_line(outcome: Restarted) -> str:
    verdict = outcome.verdict
    if verdict is None:
        return f"{outcome.name}: the next sync reloads it (refresh requested)"
    if outcome.reloads:
        why = verdict.error or verdict.line().removeprefix(f"{outcome.name}: ")
        return f"{outcome.name}: not repaired ({why}): the next sync reloads it"
    return (
        f"{outcome.name}: brought to the new slot's snapshot: {verdict.rows_compared:,} rows "
        f"compared, {verdict.repaired:,} repaired ({verdict.missing:,} missing, "
        f"{verdict.extra:,} extra, {verdict.different:,} different)"
    )
