"""Where a comparison's reads run: each side inside one snapshot of its own, both sides at
the same time (the two servers work in parallel, as two `psql` sessions would), and the
first pass over a large table as Spark tasks that import those snapshots."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from psycopg import sql

from ..base.errors import ReplicatorError, TaskError
from ..base.interrupts import raise_if_requested
from ..postgres.database import execute
from ..postgres.snapshot import ExportedSnapshot
from ..spark.runner import SparkRunner
from .range_task import QueryTask, exact, run_query_task

Query = tuple[sql.Composable, list[Any]]
Rows = list[tuple[Any, ...]]
T = TypeVar("T")
U = TypeVar("U")


class RangeReader:
    """Reads both sides of one table's comparison, each in its snapshot."""

    def __init__(
        self,
        source: ExportedSnapshot,
        destination: ExportedSnapshot,
        spark: SparkRunner | None = None,
    ) -> None:
        self.snapshots = {"source": source, "destination": destination}
        self.spark = spark  # None: every read runs in this process
        self.statements = 0
        for snapshot in self.snapshots.values():
            assert snapshot.conn is not None
            execute(snapshot.conn, "SET LOCAL jit = off")  # see range_task.TUNING

    def one(self, side: str, query: Query) -> Rows:
        return self.folded(side, query, list)

    def folded(self, side: str, query: Query, fold: Callable[[Iterator[tuple[Any, ...]]], T]) -> T:
        """What `fold` makes of the query's rows, given one at a time: a large result is
        summed or indexed as it is read, never held as a list of rows as well."""
        conn = self.snapshots[side].conn
        assert conn is not None
        self.statements += 1
        statement, params = query
        return fold(exact(row) for row in execute(conn, statement, params))

    def both(self, source: Query, destination: Query) -> tuple[Rows, Rows]:
        """The two queries at once, each on its side's snapshot connection."""
        return self.both_folded(source, destination, list, list)

    def both_folded(
        self,
        source: Query,
        destination: Query,
        source_fold: Callable[[Iterator[tuple[Any, ...]]], T],
        destination_fold: Callable[[Iterator[tuple[Any, ...]]], U],
    ) -> tuple[T, U]:
        """`folded` on both sides at once."""
        with ThreadPoolExecutor(2, thread_name_prefix="replicator-verify") as pool:
            ahead = pool.submit(self.folded, "source", source, source_fold)
            behind = self.folded("destination", destination, destination_fold)
            return ahead.result(), behind

    def spread(self, source: Sequence[Query], destination: Sequence[Query]) -> tuple[Rows, Rows]:
        """Many queries per side as one Spark job (tasks import the snapshots); the rows of
        each side's queries, concatenated."""
        assert self.spark is not None
        tasks = [
            QueryTask(side, snap.source_url, snap.snapshot_id, statement.as_string(None), params)
            for side, queries in (("source", source), ("destination", destination))
            for snap in [self.snapshots[side]]
            for statement, params in queries
        ]
        try:
            results = self.spark.map_tasks(run_query_task, tasks, "replicator verify")
        except TaskError as exc:
            raise_if_requested()
            raise ReplicatorError(str(exc)) from None
        self.statements += len(tasks)
        ours = [r for r, task in zip(results, tasks, strict=True) if task.side == "source"]
        theirs = [r for r, task in zip(results, tasks, strict=True) if task.side != "source"]
        return [row for rows in ours for row in rows], [row for rows in theirs for row in rows]
