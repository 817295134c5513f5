"""One Spark job that runs a function over a list of tasks, one partition per task.

The job maps the task numbers 0..n-1, one per partition, through one Python function: a
closure (cloudpickle ships it by value) holding each task pickled by plain `pickle`, so
nothing of replicator is imported until it has put the shipped environment on the worker's
path: a Connect server unpacks artifacts in the session's working folder, a cluster in the
executor's, both under the same alias (executor_env.ALIAS).

On a JVM of this process (`local[*]`, a cluster master) the job is an RDD's: no Spark SQL
session at all, whose start, classes and planning were a third of a local run's JVM time
(bench/RESULTS.md: Spark without Spark SQL). A Spark Connect server has no RDD
API: there it is `range(n)` in n partitions with a Python UDF over the task's number, not
Arrow-optimised (a Connect server enables that by default), so the workers need neither
pyarrow nor pandas, only what the shipped environment holds.
"""

from __future__ import annotations

import pickle
from collections.abc import Callable
from typing import Any, TypeVar

from ..base.errors import TaskError

T = TypeVar("T")
R = TypeVar("R")


def task_entry(payloads: list[bytes], alias: str) -> Callable[[int], bytes]:
    """The UDF: task `index` -> pickled (index, result, None), or (index, None, message)
    when the task failed in a way another attempt would repeat (an error whose `lasting`
    says so: a division by zero in a model). That one is returned, not raised, so Spark
    does not try the task again (four times locally, spark.task.maxFailures on a cluster)."""

    def run(index: int) -> bytes:
        import os
        import sys

        shipped = os.path.abspath(alias)
        if os.path.isdir(shipped) and shipped not in sys.path:
            sys.path.insert(0, shipped)
        function, task = pickle.loads(payloads[index])
        try:
            return pickle.dumps((index, function(task), None))
        except Exception as exc:
            if not getattr(exc, "lasting", False):
                raise
            return pickle.dumps((index, None, str(exc)))

    return run


def run_job(session: Any, function: Callable[[T], R], tasks: list[T], alias: str) -> list[R]:
    """`function(task)` for every task, in the tasks' order, as one job of len(tasks)
    partitions, on a SparkContext (this process's JVM) or a Connect session. Raises
    whatever Spark raises when a task fails for good."""
    if not tasks:
        return []
    payloads = [pickle.dumps((function, task)) for task in tasks]
    entry = task_entry(payloads, alias)
    count = len(tasks)
    if is_context(session):
        answers = session.parallelize(range(count), count).map(entry).collect()
    else:
        from pyspark.sql.connect import functions
        from pyspark.sql.types import BinaryType

        call = functions.udf(entry, BinaryType(), useArrow=False).asNondeterministic()
        rows = session.range(0, count, 1, count).select(call(functions.col("id"))).collect()
        answers = [row[0] for row in rows]
    results, failures = {}, {}
    for index, result, failure in (pickle.loads(answer) for answer in answers):
        results[index] = result
        if failure is not None:
            failures[index] = failure
    if failures:
        raise TaskError(failures[min(failures)])
    return [results[index] for index in range(count)]


def is_context(session: Any) -> bool:
    """Whether Spark here is a SparkContext of this process (else a Connect session)."""
    from pyspark import SparkContext

    return isinstance(session, SparkContext)


def default_parallelism(session: Any) -> int:
    """The task slots Spark gives a job by default: the partitions of a `range` left to
    choose (a Connect client has no SparkContext to ask)."""
    parts = session.range(0, 1 << 16).selectExpr("spark_partition_id() AS part")
    row = parts.selectExpr("max(part)").first()
    return int(row[0]) + 1
