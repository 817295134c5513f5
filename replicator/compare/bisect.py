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

from array import array
from collections.abc import Callable, Iterable, Iterator, Sequence
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
# Small buckets read by one row query: at most this many, holding at most this many rows on
# either side (a bucket alone may hold more), so that the rows held at once stay the same
# however large the table and however many of its buckets differ.
RANGES_PER_QUERY = 400
ROWS_PER_QUERY = 25_000
MASK = (1 << 64) - 1

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
    thresholds: Sequence[Bound]

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
    first = Pass(None, None, thresholds)
    sums = _first_pass(reader, shape, source, destination, first, chunks)
    found.rows_compared = sums[0].total_rows()
    found.destination_rows = sums[1].total_rows()
    passes = [(first, sums)]
    leaves: list[tuple[Range, int]] = []  # each with the rows of its bigger side
    for _level in range(MAX_LEVELS):
        bigger: list[tuple[Range, str, int]] = []
        for done, (ours, theirs) in passes:
            for bucket, mine, other in ours.differing(theirs):
                if max(mine, other) <= LEAF_ROWS:
                    leaves.append((done.bounds(bucket), max(mine, other)))
                else:
                    side = "source" if mine >= other else "destination"
                    bigger.append((done.bounds(bucket), side, max(mine, other)))
        if not bigger:
            break
        passes = [_cut(reader, shape, source, destination, *big) for big in bigger]
    else:  # never seen: buckets this stubborn are compared row by row anyway
        leaves.extend(
            (p.bounds(b), max(mine, other))
            for p, (ours, theirs) in passes
            for b, mine, other in ours.differing(theirs)
        )
    for ranges in _row_queries(leaves):
        _compare_rows(reader, shape, source, destination, ranges, fresh, found)
    return found


class Sums:
    """Each bucket's rows and the sum of their hashes, in two arrays of 8 bytes a bucket: a
    large table's first pass has a bucket per few hundred rows, and a dictionary of Python
    numbers would hold about 30 times that. A sum is kept modulo 2**64: the sums of two
    buckets whose rows differ are equal modulo 2**64 as rarely as two 64-bit hashes are."""

    def __init__(self, buckets: int, rows: Iterable[tuple[Any, ...]]) -> None:
        self.rows = array("q", bytes(8 * buckets))
        self.hashes = array("Q", bytes(8 * buckets))
        for bucket, count, total in rows:
            self.rows[bucket] += count
            self.hashes[bucket] = (self.hashes[bucket] + total) & MASK

    def total_rows(self) -> int:
        return sum(self.rows)

    def differing(self, other: Sums) -> Iterator[tuple[int, int, int]]:
        """(bucket, our rows, their rows) for each bucket the two sides differ in."""
        if self.rows == other.rows and self.hashes == other.hashes:
            return
        for bucket, (mine, theirs) in enumerate(zip(self.rows, other.rows, strict=True)):
            if mine != theirs or self.hashes[bucket] != other.hashes[bucket]:
                yield bucket, mine, theirs


def _row_queries(leaves: Sequence[tuple[Range, int]]) -> Iterator[list[Range]]:
    """The small buckets in groups of at most RANGES_PER_QUERY and ROWS_PER_QUERY rows."""
    group: list[Range] = []
    rows = 0
    for span, size in leaves:
        if group and (len(group) == RANGES_PER_QUERY or rows + size > ROWS_PER_QUERY):
            yield group
            group, rows = [], 0
        group.append(span)
        rows += size
    if group:
        yield group


def _first_pass(
    reader: RangeReader, shape: Shape, source: Side, destination: Side, first: Pass, chunks: int
) -> tuple[Sums, Sums]:
    if reader.spark is None or not first.thresholds:
        return _hashed(reader, shape, source, destination, first)
    n = len(first.thresholds) + 1  # buckets
    edges = sorted({round(i * n / chunks) for i in range(1, chunks)} - {0, n})
    spans = list(zip([0, *edges], [*edges, n], strict=True))
    ranges = [(first.bounds(a)[0], first.bounds(b - 1)[1]) for a, b in spans]
    ours, theirs = reader.spread(
        [q.checksums(shape, source, first.thresholds, lo, hi) for lo, hi in ranges],
        [q.checksums(shape, destination, first.thresholds, lo, hi) for lo, hi in ranges],
    )
    return Sums(n, ours), Sums(n, theirs)


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
    return piece, _hashed(reader, shape, source, destination, piece)


def _hashed(
    reader: RangeReader, shape: Shape, source: Side, destination: Side, done: Pass
) -> tuple[Sums, Sums]:
    """A pass's bucket sums on both sides at once, each folded as its rows are read."""
    buckets = len(done.thresholds) + 1

    def sums(rows: Iterable[tuple[Any, ...]]) -> Sums:
        return Sums(buckets, rows)

    return reader.both_folded(
        q.checksums(shape, source, done.thresholds, done.lo, done.hi),
        q.checksums(shape, destination, done.thresholds, done.lo, done.hi),
        sums,
        sums,
    )


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

    def by_key(rows: Iterator[tuple[Any, ...]]) -> tuple[dict[Key, Any], dict[Key, set[Any]]]:
        """The source's rows by key: (hash, not yet synced), and the keys on more than one
        row with each of their hashes."""
        mine: dict[Key, tuple[Any, bool]] = {}
        repeated: dict[Key, set[Any]] = {}
        for row in rows:
            key, digest, is_fresh = tuple(row[:width]), row[width], row[width + 1]
            if key in mine:
                repeated.setdefault(key, {mine[key][0]}).add(digest)
                is_fresh = is_fresh or mine[key][1]  # any of its rows not yet synced: the key is
            mine[key] = (digest, is_fresh)
        return mine, repeated

    (mine, repeated), other = reader.both_folded(
        q.row_hashes(shape, source, ranges, *(fresh or (None, []))),
        q.row_hashes(shape, destination, ranges),
        by_key,
        lambda rows: {tuple(row[:width]): row[width] for row in rows},
    )
    found.repeated.extend(repeated)
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
