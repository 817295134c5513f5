"""Differences a sync resolved while `verify` read: a `cdc` table's rows that differed
between the two snapshots and are equal now.

The slot tells a change not yet applied from a difference only while it still holds the
change; a sync running beside verify (`sync --follow`) applies changes and moves the slot
past them between verify's snapshots and its look at the slot. Reading the differing rows
again, on both sides, as they are now, tells them apart: such a row is counted as not yet
synced; a row that still differs (read again a few times: a sync may apply between the two
reads) is a difference.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..postgres.database import execute
from ..postgres.endpoints import Endpoints
from . import range_sql as q
from .bisect import Key
from .comparison import Sides

CHUNK = 5_000  # keys a statement reads
ROUNDS = 3


def caught_up(ends: Endpoints, sides: Sides, columns: Sequence[str], keys: list[Key]) -> set[Key]:
    """The keys whose rows are the same on both sides now (or absent from both)."""
    settled: set[Key] = set()
    left = list(keys)
    for _ in range(ROUNDS):
        source = _rows(ends, sides, "source", columns, left)
        destination = _rows(ends, sides, "destination", columns, left)
        now = {k for k in left if source.get(k) == destination.get(k)}
        settled |= now
        left = [k for k in left if k not in now]
        if not left or not now:
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
