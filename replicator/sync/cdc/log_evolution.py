"""A `cdc` table's copy takes a source schema change in place (`on_schema_change: "evolve"`)
at the change's own place in the log.

The drain applies the table's changes while the log's shape fits the copy's, and stops it
before the first transaction whose shape does not (cdc/capture_table.py): the commits
before are in the copy, with their position, and the slot keeps that transaction. Or the
drain reaches its end with no such transaction, while the catalog showed the change when
the run planned the table: the ALTER committed before the drain's end, and no change of the
table came after it, so the copy is current to the drain's end in every column it has.
Either way the copy is current to one place in the log, and the change is taken there:

1. the table is planned again (plan/drift.py), so that the ALTERs come from the diff of the
   stored signature and the catalog now, as for a cursor table. At a Relation message, the
   catalog must still be the shape that message gave, else the table changed again since,
   and it reloads;
2. sync/incremental/evolve.py runs the ALTERs and brings the added columns' values to the
   source's, read in one snapshot taken after the drain's end; the copy's position does
   not move;
3. the run drains the table again from its position (cdc_run.py): each change from there
   carries whole rows, so every row a change touched after the position ends as its last
   change left it, and every other row holds the snapshot's values, which are that
   position's, as no change touched the row in between. Then the NOT NULLs are set.
"""

from __future__ import annotations

from dataclasses import replace

from ...cdc.capture_table import CaptureTable, ShapeColumn, source_shape
from ...plan.decide import Plan
from ...plan.drift import plan_now
from ...plan.evolution import Evolution
from ..context import TableJob
from ..incremental.evolve import take_in_place


def needs_evolution(job: TableJob, table: CaptureTable) -> bool:
    """The drain stopped the table at a change of shape, or drained it to the end with a
    change the catalog showed at planning still to take."""
    if table.error is not None or table.drift is not None:
        return False
    return table.evolving is not None or isinstance(job.observed.evolution, Evolution)


def evolve_at_log(job: TableJob, table: CaptureTable) -> tuple[TableJob, list[str]] | str:
    """Take the change in place (see above): the job planned afresh, its state written with
    the new signature, and the NOT NULLs to set once the table is drained again (till then
    the copy holds rows the source deleted after the log's change, which lack the new
    columns' values); or why it cannot, the reload's reason."""
    run, ends = job.run, job.ends
    fresh = plan_now(ends.source, ends.dest, job.table, run.project.templates, job.state)
    found, change = fresh.observed.evolution, fresh.observed.schema_change
    if found is None:  # the catalog has the copy's shape: the log's was a passing one
        return "schema changed: in the log: a shape the catalog no longer has (cannot evolve)"
    if isinstance(found, str):
        return f"schema changed: {change} (cannot evolve: {found})"
    if fresh.plan.action != "incremental":
        return fresh.plan.reason
    if table.evolving is not None:
        logged = tuple(
            ShapeColumn(c.name, c.type_oid, c.type_modifier) for c in table.evolving.columns
        )
        if source_shape(ends.source, fresh.source.oid) != logged:
            return (
                f"schema changed: {change} (cannot evolve: the table changed again after the "
                "change the log shows)"
            )
    destination = fresh.observed.destination
    assert destination is not None
    found, not_null = found.nullable_first(job.table.target)
    reason = f"schema evolved: {change}"
    why = take_in_place(ends, fresh.built, fresh.source, destination, found, reason)
    if why is not None:
        return f"schema changed: {change} (cannot evolve: {why})"
    assert job.state is not None
    state = job.state.model_copy(update={"schema_signature": fresh.observed.signature.as_json()})
    job.write_state(state)
    observed = replace(fresh.observed, evolution=None, schema_changes=())
    planned = replace(fresh, observed=observed, plan=Plan("incremental", reason))
    return replace(job, planned=planned, state=state), not_null
