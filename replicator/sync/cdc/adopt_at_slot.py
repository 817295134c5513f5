"""`"initial_load": "skip"` for a `cdc` table: its copy is adopted as it is and goes on from
the project slot's position, with no backfill (a huge table loaded by other means, say).

Unlike a cursor table's start, the destination table is never created empty: an empty copy
fed only the log would hold the changed rows alone, which is no copy of the table. A missing
table, or one whose columns, types or key differ from the source, fails with the fix; the
table is never reloaded silently. The copy's position is the slot's confirmed position
(every change the slot still holds is applied to it: an upsert or a delete of a row the copy
already holds as the change left it changes nothing), recorded in `_replicator.cdc_applied`
in the transaction that records the table as the tool's.
"""

from __future__ import annotations

from ...base.errors import TableProblem
from ...cdc.source.slot import lsn_text, slot_info
from ...plan.signature import Signature
from ...plan.table_sql import TableSql
from ...postgres.catalog import TableInfo
from ...postgres.database import Endpoints, run_steps
from ...project.state import LSN_CURSOR_TYPE, Cursor
from ..scripts import DestinationFacts, start_steps
from ..skip_backfill import StartResult, require_same_shape


def adopt_at_slot(
    ends: Endpoints,
    built: TableSql,
    destination: TableInfo | None,
    signature: Signature,
    slot: str,
) -> StartResult:
    """Adopt the destination table at the slot's position; TableProblem when it cannot be."""
    name, target = built.table.written_name, built.table.target
    skip = '"initial_load": "skip"'
    if destination is None:
        raise TableProblem(
            f"{name}: {skip} with mode cdc adopts the destination table {target}, which does "
            "not exist: create it with the source's columns, types and key and fill it (a "
            f"restored dump, say), or remove {skip} to load the table in full"
        )
    require_same_shape(built, destination, signature, f"remove {skip} to load the table in full")
    info = slot_info(ends.source, slot)
    if info is None or info.confirmed is None:
        raise TableProblem(f"{name}: replication slot {slot} disappeared during the run")
    position = lsn_text(info.confirmed)
    facts = DestinationFacts.read(ends.source, ends.dest, built, types=False)
    run_steps(ends.dest, start_steps(built, facts, exists=True, position=position))
    return StartResult(False, Cursor(value=position, type=LSN_CURSOR_TYPE), None, None)
