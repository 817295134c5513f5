"""A table without a key (`full-refresh` only: plan/table_key.py), compared as a multiset of
rows and repaired by exactly the copies that differ.

With no key, a row is only its values, and a table may hold the same row twice: each side
is counted as its distinct rows with how many copies of each it holds. `missing` is the
copies the destination lacks, `extra` the copies it has too many; `different` cannot be
told apart from one missing and one extra row, so it is always 0. The statements are in
`multiset_sql.py`. Both sides are read in this process, at once, each in its own snapshot:
one GROUP BY scan each when nothing differs, two more when something does (no Spark tasks:
there are no key ranges to split the scan by).

A repair deletes the extra copies (any of the alike ones, by `ctid`) and inserts the missing
ones from the source's snapshot, in transactions of at most BATCH_ROWS distinct rows, and
writes no other row.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import psycopg

from ..base.failpoints import failpoint
from ..postgres.database import execute, transaction
from . import multiset_sql as m
from .range_sql import Shape, Side
from .reader import RangeReader
from .repair import BATCH_ROWS, Target
from .thresholds import BUCKET_ROWS, INTEGER_TYPES
from .verdict import MAX_EXAMPLES

MAX_BUCKETS = 1 << 20
READ_ROWS = 10_000  # distinct rows a repair reads back from the source per query

Copies = dict[int, int]  # row hash -> number of copies


@dataclass(frozen=True)
class MultisetDiff:
    """The copies of each row that one side holds and the other does not."""

    rows_compared: int  # the source's rows
    destination_rows: int
    missing: Copies  # in the source, not (or fewer times) in the destination
    extra: Copies  # in the destination, not (or fewer times) in the source

    @property
    def missing_rows(self) -> int:
        return sum(self.missing.values())

    @property
    def extra_rows(self) -> int:
        return sum(self.extra.values())


def diff_multisets(
    reader: RangeReader, shape: Shape, source: Side, destination: Side, estimated_rows: int
) -> MultisetDiff:
    """Bucket sums first; the hashes of the buckets that differ, counted, second."""
    buckets = max(1, min(estimated_rows // BUCKET_ROWS, MAX_BUCKETS))
    ours, theirs = reader.both(
        m.bucket_sums(shape, source, buckets), m.bucket_sums(shape, destination, buckets)
    )
    mine = {bucket: (count, total) for bucket, count, total in ours}
    other = {bucket: (count, total) for bucket, count, total in theirs}
    rows = sum(count for count, _ in mine.values())
    there = sum(count for count, _ in other.values())
    differing = sorted(b for b in set(mine) | set(other) if mine.get(b) != other.get(b))
    if not differing:
        return MultisetDiff(rows, there, {}, {})
    ours, theirs = reader.both(
        m.hash_counts(shape, source, buckets, differing),
        m.hash_counts(shape, destination, buckets, differing),
    )
    held, kept = dict(ours), dict(theirs)
    return MultisetDiff(rows, there, _surplus(held, kept), _surplus(kept, held))


def _surplus(one: Copies, other: Copies) -> Copies:
    return {h: n - other.get(h, 0) for h, n in one.items() if n > other.get(h, 0)}


def examples(
    reader: RangeReader,
    shape: Shape,
    sides: tuple[Side, Side],
    types: dict[str, str],
    diff: MultisetDiff,
) -> list[dict[str, Any]]:
    """Up to MAX_EXAMPLES differing rows: the whole row as the key, its kind and how many
    copies differ."""
    out: list[dict[str, Any]] = []
    kinds = (("missing", sides[0], diff.missing), ("extra", sides[1], diff.extra))
    for kind, side, copies in kinds:
        hashes = sorted(copies)[: MAX_EXAMPLES - len(out)]
        if not hashes:
            continue
        for row in reader.one(side.name, m.rows_of(shape, side, hashes)):
            values = _as_json(shape.columns, types, row[1:])
            out.append({"key": values, "kind": kind, "count": copies[row[0]]})
    return out


def _as_json(
    columns: Sequence[str], types: dict[str, str], values: Sequence[Any]
) -> dict[str, Any]:
    """A row as JSON: integers as numbers, everything else as PostgreSQL prints it."""
    return {
        c: int(v) if v is not None and types[c] in INTEGER_TYPES else v
        for c, v in zip(columns, values, strict=True)
    }


def repair_multiset(
    dest: psycopg.Connection[Any],
    reader: RangeReader,
    shape: Shape,
    source: Side,
    target: Target,
    diff: MultisetDiff,
) -> int:
    """Delete the extra copies, insert the missing ones; the number of rows removed or
    written."""
    done = 0
    for batch in _batches(sorted(diff.extra.items()), BATCH_ROWS):
        with transaction(dest):
            execute(dest, *m.delete_copies(shape, target.table, batch))
            failpoint("repair-before-commit")
        done += sum(n for _, n in batch)
    for hashes in _batches(sorted(diff.missing), READ_ROWS):
        rows = reader.one("source", m.rows_of(shape, source, hashes))
        for batch in _batches(rows, BATCH_ROWS):
            copies = [(diff.missing[row[0]], row[1:]) for row in batch]
            with transaction(dest):
                execute(dest, *m.insert_copies(target.table, target.columns, copies))
                failpoint("repair-before-commit")
            done += sum(n for n, _ in copies)
    return done


def _batches(items: Sequence[Any], size: int) -> Iterator[Sequence[Any]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]
