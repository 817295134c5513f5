"""Finding the rows that differ between two sides with little more than one scan of each.

1. Cut the key space into buckets of a few hundred rows (`thresholds.py`) and, in one scan
   per side, sum a 64-bit hash of every row per bucket.
2. A bucket whose row count or hash sum differs is compared row by row when it is small;
   a large one is cut again, at every few-hundredth key of its bigger side, and hashed again
   (data-diff's bisection, with a wide fan-out so that one level is nearly always enough).
3. The small buckets' rows are read with their keys and hashes, in one query per side, and
   matched by key: missing, extra, or different. On the source, each row also says whether
   the cursor has yet to reach it (`fresh`): such a row is not yet synced, not a difference.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from psycopg import sql

from . import range_sql as q
from .range_sql import Bound, Shape, Side
from .reader import RangeReader

LEAF_ROWS = 2000  # a bucket this small (on both sides) is compared row by row
SPLIT_ROWS = 250  # a bigger one is cut into buckets of this many rows of its bigger side
MAX_PIECES = 64  # ... or into at most this many, for a composite key (see range_sql.bucket)
MAX_LEVELS = 12
RANGES_PER_QUERY = 400  # small buckets read by one row query

Key = tuple[str, ...]
Range = tuple[Bound | None, Bound | None]


@dataclass
class Found:
    """What a comparison found; keys as text tuples, in the key's column order."""

    rows_compared: int = 0  # the source's rows
    destination_rows: int = 0
    missing: list[Key] = field(default_factory=list)
    extra: list[Key] = field(default_factory=list)
    different: list[Key] = field(default_factory=list)
    not_yet_synced: list[Key] = field(default_factory=list)
    # Keys on more than one source row (a configured primary_key the source does not keep
    # unique): the copy holds one row per key, so one that matches any of them is no
    # difference; a repair leaves them (sync keeps the newest: verdict.py says so).
    repeated: list[Key] = field(default_factory=list)

    @property
    def differences(self) -> int:
        return len(self.missing) + len(self.extra) + len(self.different)

    def set_aside(self, waiting: Callable[[Key], bool], kinds: Sequence[str]) -> None:
        """Count the differences of these kinds whose key `waiting` says a change not yet
        applied explains as not yet synced instead (the next sync brings them)."""
        for kind in kinds:
            keys: list[Key] = getattr(self, kind)
            setattr(self, kind, [k for k in keys if not waiting(k)])
            self.not_yet_synced.extend(k for k in keys if waiting(k))


@dataclass(frozen=True)
class Pass:
    """One hashing pass over a range, cut into buckets at `thresholds`."""

    lo: Bound | None
    hi: Bound | None
    thresholds: tuple[Bound, ...]

    def bounds(self, bucket: int) -> Range:
        t = self.thresholds
        return (t[bucket - 1] if bucket > 0 else self.lo, t[bucket] if bucket < len(t) else self.hi)


def find_differences(
    reader: RangeReader,
    shape: Shape,
    source: Side,
    destination: Side,
    thresholds: Sequence[Bound],
    *,
    fresh: tuple[sql.Composable, list[Any]] | None = None,
    chunks: int = 1,
) -> Found:
    """Compare the two sides. With a reader on Spark, the first pass runs as `chunks` tasks
    per side (key ranges). `fresh`: a boolean expression over the source row that is true
    when the cursor has yet to reach it."""
    found = Found()
    first = Pass(None, None, tuple(thresholds))
    sums = _first_pass(reader, shape, source, destination, first, chunks)
    found.rows_compared = sum(count for count, _ in sums[0].values())
    found.destination_rows = sum(count for count, _ in sums[1].values())
    passes = [(first, sums)]
    leaves: list[Range] = []
    for _level in range(MAX_LEVELS):
        bigger: list[tuple[Range, str, int]] = []
        for done, (ours, theirs) in passes:
            for bucket in sorted(set(ours) | set(theirs)):
                mine, other = ours.get(bucket, (0, 0)), theirs.get(bucket, (0, 0))
                if mine == other:
                    continue
                if max(mine[0], other[0]) <= LEAF_ROWS:
                    leaves.append(done.bounds(bucket))
                else:
                    side = "source" if mine[0] >= other[0] else "destination"
                    bigger.append((done.bounds(bucket), side, max(mine[0], other[0])))
        if not bigger:
            break
        passes = [_cut(reader, shape, source, destination, *big) for big in bigger]
    else:  # never seen: buckets this stubborn are compared row by row anyway
        leaves.extend(
            p.bounds(b)
            for p, (ours, theirs) in passes
            for b in set(ours) | set(theirs)
            if ours.get(b) != theirs.get(b)
        )
    for start in range(0, len(leaves), RANGES_PER_QUERY):
        _compare_rows(
            reader,
            shape,
            source,
            destination,
            leaves[start : start + RANGES_PER_QUERY],
            fresh,
            found,
        )
    return found


Sums = dict[int, tuple[int, int]]


def _sums(rows: Iterable[tuple[Any, ...]]) -> Sums:
    out: Sums = {}
    for bucket, count, total in rows:
        had = out.get(bucket, (0, 0))
        out[bucket] = (had[0] + count, had[1] + total)
    return out


def _first_pass(
    reader: RangeReader, shape: Shape, source: Side, destination: Side, first: Pass, chunks: int
) -> tuple[Sums, Sums]:
    if reader.spark is None or not first.thresholds:
        ours, theirs = reader.both(
            q.checksums(shape, source, first.thresholds, None, None),
            q.checksums(shape, destination, first.thresholds, None, None),
        )
        return _sums(ours), _sums(theirs)
    n = len(first.thresholds) + 1  # buckets
    edges = sorted({round(i * n / chunks) for i in range(1, chunks)} - {0, n})
    spans = list(zip([0, *edges], [*edges, n], strict=True))
    ranges = [(first.bounds(a)[0], first.bounds(b - 1)[1]) for a, b in spans]
    ours, theirs = reader.spread(
        [q.checksums(shape, source, first.thresholds, lo, hi) for lo, hi in ranges],
        [q.checksums(shape, destination, first.thresholds, lo, hi) for lo, hi in ranges],
    )
    return _sums(ours), _sums(theirs)


def _cut(
    reader: RangeReader,
    shape: Shape,
    source: Side,
    destination: Side,
    span: Range,
    side: str,
    rows: int,
) -> tuple[Pass, tuple[Sums, Sums]]:
    """Cut a large differing range of `rows` rows at every SPLIT_ROWS-th key of its bigger
    side (into at most MAX_PIECES for a composite key), and hash the pieces on both sides."""
    lo, hi = span
    every = SPLIT_ROWS if len(shape.key) == 1 else max(SPLIT_ROWS, -(-rows // MAX_PIECES))
    cuts = reader.one(
        side, q.split_points(shape, source if side == "source" else destination, lo, hi, every)
    )
    piece = Pass(lo, hi, tuple(tuple(row) for row in cuts))
    ours, theirs = reader.both(
        q.checksums(shape, source, piece.thresholds, lo, hi),
        q.checksums(shape, destination, piece.thresholds, lo, hi),
    )
    return piece, (_sums(ours), _sums(theirs))


def _compare_rows(
    reader: RangeReader,
    shape: Shape,
    source: Side,
    destination: Side,
    ranges: Sequence[Range],
    fresh: tuple[sql.Composable, list[Any]] | None,
    found: Found,
) -> None:
    width = len(shape.key)
    ours, theirs = reader.both(
        q.row_hashes(shape, source, ranges, *(fresh or (None, []))),
        q.row_hashes(shape, destination, ranges),
    )
    mine: dict[Key, tuple[Any, bool]] = {}
    repeated: dict[Key, set[Any]] = {}
    for row in ours:
        key = tuple(row[:width])
        fresh = row[width + 1]
        if key in mine:
            repeated.setdefault(key, {mine[key][0]}).add(row[width])
            fresh = fresh or mine[key][1]  # any of its rows not yet synced: the key is
        mine[key] = (row[width], fresh)
    found.repeated.extend(repeated)
    other = {tuple(row[:width]): row[width] for row in theirs}
    for key, (digest, is_fresh) in mine.items():
        there = other.get(key)
        if there == digest or there in repeated.get(key, ()):
            continue
        if is_fresh:
            found.not_yet_synced.append(key)
        elif there is None:
            found.missing.append(key)
        else:
            found.different.append(key)
    found.extra.extend(key for key in other if key not in mine)
