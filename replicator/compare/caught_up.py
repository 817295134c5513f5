"""Differences a sync resolved while `verify` read: a `cdc` table's rows that differed
between the two snapshots and are equal now, or have a change in the slot now.

The slot tells a change not yet applied from a difference only while it still holds the
change; a sync running beside verify (`sync --follow`) applies changes and moves the slot
past them between verify's snapshots and its look at the slot. Reading the differing rows
again, on both sides, as they are now, tells them apart: such a row is counted as not yet
synced. A writer may have changed the row again meanwhile, so a row that still differs is
looked up in the slot once more, peeked after the read and from the table's applied
position then (a change applied before is not pending: the read saw it applied): a change
the read saw on the source and not on the destination is there, or was applied since, and
the next round reads the row equal. A row that differs and has no change in the slot in
every round is a difference.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence

from ..base.failpoints import pause_point
from ..postgres.database import Endpoints, execute
from . import range_sql as q
from .bisect import Key
from .comparison import Sides

CHUNK = 5_000  # keys a statement reads
ROUNDS = 3


def caught_up(
    ends: Endpoints,
    sides: Sides,
    columns: Sequence[str],
    keys: list[Key],
    pending: Callable[[list[Key]], Collection[Key] | None],
) -> set[Key]:
    """The keys whose rows are the same on both sides now (or absent from both), or whose
    change is in the slot now. `pending`: the keys among those given that changes in the
    slot touch, None when a pending TRUNCATE touches them all."""
    settled: set[Key] = set()
    left = list(keys)
    pause_point("verify-before-reading-again")
    for _ in range(ROUNDS):
        source = _rows(ends, sides, "source", columns, left)
        destination = _rows(ends, sides, "destination", columns, left)
        now = {k for k in left if source.get(k) == destination.get(k)}
        left = [k for k in left if k not in now]
        if left:
            waiting = pending(left)
            now |= set(left) if waiting is None else set(waiting).intersection(left)
            left = [k for k in left if k not in now]
        settled |= now
        if not left:
            break
    return settled


def _rows(
    ends: Endpoints, sides: Sides, side: str, columns: Sequence[str], keys: list[Key]
) -> dict[Key, tuple[object, ...]]:
    conn = ends.source if side == "source" else ends.dest
    read = sides.source if side == "source" else sides.destination
    width = len(sides.shape.key)
    found: dict[Key, tuple[object, ...]] = {}
    for start in range(0, len(keys), CHUNK):
        statement, params = q.rows_of(sides.shape, read, columns, keys[start : start + CHUNK])
        for row in execute(conn, statement, params).fetchall():
            found[tuple(row[:width])] = tuple(row[width:])
    return found
