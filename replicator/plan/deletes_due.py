"""Whether a table's next sync runs its delete check (`deletes`, `deletes_interval`): the
sync asks it after a batch; `verify` asks it of a row only the copy has, which the next
sync removes only then (else it is a difference, as any row added to the copy by hand)."""

from __future__ import annotations

from datetime import UTC, datetime

from ..project.config import TableConfig
from ..project.state import TableState


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
