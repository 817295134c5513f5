"""Each action's complete list of statements for one table, as `compile` prints it.

Assembled from the builders the actions run (scripts.py, the swap's, the copy tasks'), fed
with the same reads the actions make before they write: missing schemas and types, the
partition plan, the swap's facts. Values a run makes up as it goes are placeholders here:
`<load id>`, `<snapshot>`, a task's `<rows>`. tests/test_compile_equals_sync.py runs each
action with statement capture on and compares.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import psycopg
from psycopg import sql

from ..plan.decide import Plan
from ..plan.drift import Observed
from ..plan.evolution import Evolution
from ..plan.read_ahead import NOTHING_READ, ReadAhead
from ..plan.table_sql import TableSql, fitting_cursor
from ..postgres.catalog import TableInfo
from ..postgres.database import Endpoints, Step, execute
from ..postgres.history_tables import snapshot_steps
from ..postgres.naming import default_key_name
from ..postgres.swap import SwapFacts, read_facts, swap_script
from ..project.settings import Settings
from ..project.state import TableState
from ..spark.engine_choice import EngineChoice, local_slots
from ..transfer.copy_stream import stream_steps, task_steps
from .context import KeyBounds
from .full_load.parts import estimated_rows, part_tasks, plan_parts
from .full_load.resume import (
    Found,
    abandon_steps,
    can_resume,
    find,
    forget_step,
    outlook,
    record_step,
    resumable,
    start_over_steps,
    unfinished_targets,
)
from .incremental.batch import batch_for, batch_tasks
from .incremental.evolve import evolve_script
from .scripts import (
    SNAPSHOT_TIME,
    DestinationFacts,
    direct_batch,
    end_load_steps,
    key_steps,
    merge_steps,
    prepare_steps,
    side_key_name,
    side_table,
    staging_steps,
    start_load_steps,
    start_steps,
)

LOAD_ID = "<load id>"
SNAPSHOT = "<snapshot>"
RESUME_PLAN = {"parts": "<partitions>", "cursor": "<the snapshot's first cursor>"}


@dataclass(frozen=True)
class Tasks:
    """A load's copy tasks, each running its statements (one transaction on each side)."""

    steps: list[list[Step]]


Item = Step | Tasks


@dataclass
class ActionScripts:
    """What each action would run for the table now."""

    full_reload: list[Item]
    incremental: list[Item] | None = None
    staging: list[Step] | None = None  # the incremental's first statements, on their own
    start: list[Item] | None = None  # initial_load skip, when it is the next action
    resync: list[Item] | None = None  # with --since
    # a `cdc` table's schema change taken in place where the log reaches it, NOT NULLs last
    cdc_evolution: list[Item] | None = None
    notes: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Inputs:
    """Where to look, and what a sync would decide from its settings."""

    source: psycopg.Connection[Any]
    dest: psycopg.Connection[Any] | None
    urls: tuple[str, str]
    settings: Settings
    ahead: ReadAhead = NOTHING_READ  # the catalogs read for all the command's tables


def action_scripts(
    inputs: Inputs,
    built: TableSql,
    source: TableInfo,
    state: TableState | None,
    plan: Plan,
    destination_exists: bool,
    resync: KeyBounds | None = None,
    evolving: Observed | None = None,
) -> ActionScripts:
    """Read what the actions read, and build what they would run; an incremental run that
    takes a schema change in place (`evolving`'s evolution) starts with the evolution's."""
    scripts = ActionScripts(full_reload=[])
    version = inputs.source.info.server_version
    facts = _facts(inputs, built, scripts)
    resumes = plan.action == "full_reload"  # else `sync -f` (or `refresh`) would start over
    scripts.full_reload = _full_reload(inputs, built, source, facts, version, scripts, resumes)
    if built.merge is not None:
        if state is None or fitting_cursor(built, state.cursor) is None:
            # no cursor of this key (no state, or another key or mode): read from the start
            state = TableState(table=str(built.table.name))
        batch_facts = _incremental_facts(inputs, built)
        scripts.staging = staging_steps(built, batch_facts)
        found = _unfinished(inputs, built)
        if found is not None and plan.action != "full_reload":
            scripts.notes.append(
                f"drops an unfinished reload ({len(found.loaded)} of "
                f"{len(found.resume.parts)} partitions loaded) before its batch"
            )
        unfinished = found is not None
        scripts.incremental = _incremental(
            inputs, built, state, batch_facts, None, version, unfinished
        )
        evolution = evolving.evolution if evolving is not None else None
        if isinstance(evolution, Evolution) and inputs.dest is not None:
            assert evolving is not None and evolving.destination is not None
            ends = Endpoints(inputs.source, inputs.dest, *inputs.urls)
            evolve = evolve_script(ends, built, source, evolving.destination, evolution)
            scripts.incremental = [*evolve.steps, *scripts.incremental]
        if resync is not None:
            scripts.resync = _incremental(
                inputs, built, state, batch_facts, resync, version, unfinished
            )
    evolution = evolving.evolution if evolving is not None else None
    if built.table.mode == "cdc" and isinstance(evolution, Evolution) and inputs.dest is not None:
        assert evolving is not None and evolving.destination is not None
        ends = Endpoints(inputs.source, inputs.dest, *inputs.urls)
        first, not_null = evolution.nullable_first(built.table.target)
        evolve = evolve_script(ends, built, source, evolving.destination, first)
        scripts.cdc_evolution = [*evolve.steps, *(Step("destination", s) for s in not_null)]
    if plan.action == "skip_backfill":
        at_slot = built.table.mode == "cdc"  # adopted at the slot's position (capture_adopt)
        position = "<slot position>" if at_slot else None
        exists = destination_exists or at_slot
        scripts.start = list(start_steps(built, facts, exists=exists, position=position))
    return scripts


def _facts(inputs: Inputs, built: TableSql, scripts: ActionScripts) -> DestinationFacts:
    if inputs.dest is None:
        scripts.notes.append(
            "without the destination, missing schemas and user-defined types are not shown"
        )
        return DestinationFacts((), ())
    return DestinationFacts.read(inputs.source, inputs.dest, built)


def _full_reload(
    inputs: Inputs,
    built: TableSql,
    source: TableInfo,
    facts: DestinationFacts,
    version: int,
    scripts: ActionScripts,
    next_resumes: bool,
) -> list[Item]:
    """The reload's script; when it is the next action and an unfinished load can be
    resumed, the resumed one."""
    target = built.table.target
    choice = EngineChoice.for_settings(inputs.settings)
    in_process = not choice.spark_for(estimated_rows(inputs.source, source))
    parallelism = 1 if in_process else _spark_cores(inputs.settings, scripts)
    plan = plan_parts(inputs.source, built, source, parallelism)
    tasks = part_tasks(SNAPSHOT, inputs.urls, built, LOAD_ID, plan, list(range(len(plan))))
    swap = (
        read_facts(inputs.dest, target)
        if inputs.dest is not None
        else SwapFacts(0, None, (), default_key_name(target), default_key_name(target), "")
    )
    wanted = swap.objects.with_configured(built.indexes).indexes
    indexes = [index for index in wanted if index.tail is not None]
    swapped = swap_script(swap, side_table(target), target, side_key_name(built), indexes)
    history = snapshot_steps(built.history, SNAPSHOT_TIME) if built.history is not None else []
    finish = [
        *key_steps(built, indexes),
        *swapped.steps([forget_step(target), *history]),
        *end_load_steps(LOAD_ID),
    ]
    resumes = resumable(built.table.mode, built.table.replication_key)
    seen = outlook(inputs.source, inputs.dest, built, source) if resumes and inputs.dest else None
    if seen is not None and seen[1] is None and not next_resumes:
        seen = (seen[0], "the next action is not this reload (sync -f starts over)")
    if seen is not None and seen[1] is None:  # the next sync resumes an unfinished load
        found = seen[0]
        todo = [i for i in range(len(found.resume.parts)) if i not in found.loaded]
        parts = part_tasks(
            SNAPSHOT, inputs.urls, built, found.resume.load_id, found.resume.parts, todo
        )
        scripts.notes.append(
            f"resumes an unfinished load: {len(found.loaded)} of {len(found.resume.parts)} "
            "partitions loaded; the incremental script follows, from its first snapshot's cursor"
        )
        return [
            *prepare_steps(built, facts, keep_side=True),
            Tasks([task_steps(task, version) for task in parts]),
            *finish,
        ]
    # A cursor table's load is noted as resumable before its tasks (sync/full_load/resume.py).
    noted = (
        [record_step(target, LOAD_ID, RESUME_PLAN)] if resumes and can_resume(built, plan) else []
    )
    if seen is not None and next_resumes:
        scripts.notes.append(f"starts an unfinished load over: {seen[1]}")
    return [
        *(start_over_steps(target) if seen is not None else []),
        *prepare_steps(built, facts),
        *start_load_steps(target),
        *noted,
        Tasks([task_steps(task, version) for task in tasks]),
        *finish,
    ]


def _incremental(
    inputs: Inputs,
    built: TableSql,
    state: TableState,
    facts: DestinationFacts,
    resync: KeyBounds | None,
    version: int,
    unfinished: bool,
) -> list[Item]:
    """The batch's script; `unfinished`: sync first drops an unfinished reload."""
    rows = _batch_rows(inputs.source, built, state, resync)
    choice = EngineChoice.for_settings(inputs.settings)
    in_process = not choice.spark_for(rows)
    # sync counts the batch only where Spark may take it (table_actions._incremental)
    batch = batch_for(built, state, rows if choice.spark_for(1 << 62) else 0, in_process, resync)
    target = built.table.target
    unfinished_steps = abandon_steps(target) if unfinished else []  # sync drops it first
    if batch.direct:
        return [*unfinished_steps, *direct_batch(built, batch.query, inputs.ahead.leftovers).steps]
    parallelism = 1 if in_process else _spark_cores(inputs.settings, ActionScripts([]))
    tasks = batch_tasks(inputs.source, SNAPSHOT, inputs.urls, built, batch, LOAD_ID, parallelism)
    merged = len(tasks) if batch.parts > 1 else 1  # in parts: each merged as it lands
    if batch.parts > 1:  # no markers: read on the run's own session, never retried
        copy = [Tasks([stream_steps(tasks)])]
    else:
        copy = [
            *start_load_steps(built.table.target),
            Tasks([task_steps(task, version) for task in tasks]),
            *end_load_steps(LOAD_ID),
        ]
    return [
        *unfinished_steps,
        *staging_steps(built, facts, batch.parts),
        *copy,
        *merge_steps(built, merged, batch.parts),
    ]


def _unfinished(inputs: Inputs, built: TableSql) -> Found | None:
    """The table's unfinished reload, which an incremental run drops first."""
    if inputs.dest is None or not resumable(built.table.mode, built.table.replication_key):
        return None
    if built.table.target.sql() not in unfinished_targets(inputs.dest):
        return None  # no record: read once for all tables
    return find(inputs.dest, built.table.target)


def _incremental_facts(inputs: Inputs, built: TableSql) -> DestinationFacts:
    if inputs.dest is None:
        return DestinationFacts((), ())
    return DestinationFacts.read(inputs.source, inputs.dest, built, types=False)


def _batch_rows(
    conn: psycopg.Connection[Any], built: TableSql, state: TableState, resync: KeyBounds | None
) -> int:
    """How many rows the batch holds now (the probe's count, which decides where they are
    copied), or none when the table was never loaded."""
    if state.last_synced_at is None and resync is None:
        return 0
    batch = batch_for(built, state, 0, True, resync)
    (rows,) = execute(
        conn, sql.SQL("SELECT count(*) FROM ({}) AS b").format(batch.query)
    ).fetchone()
    return int(rows)


def _spark_cores(settings: Settings, scripts: ActionScripts) -> int:
    """The task slots a local master gives (what `spark.parallelism()` reports), or the warm
    server's (recorded at its start); a cluster's are known only once Spark starts."""
    if settings.warm_server is not None:
        return settings.warm_server.parallelism
    if settings.spark_remote:
        scripts.notes.append("partitions on a Spark Connect server depend on its cores: one shown")
        return 1
    slots = local_slots(settings.spark_master)
    if slots is None:
        scripts.notes.append("partitions on a cluster depend on its cores: one shown")
        return 1
    return slots
