"""Spark's Python worker daemon for local runs, importing the installed pyspark.

Spark puts `pyspark.zip` first on its workers' PYTHONPATH. That zip holds no bytecode, so
every worker compiles pyspark's modules again, most of the time of each run's first Spark
job, where the installed package has its bytecode. In local mode the installed package is the very
Spark that runs the job, so the zip entries move to the end of the path (still there as a
fallback) and pyspark's own daemon runs as usual. Clusters keep Spark's default daemon.

The daemon also imports the copy tasks' code (psycopg included) before it forks: a worker forked
later, after an idle one was stopped (a minute idle) or for a new session of the warm
server, starts with it loaded instead of importing it.
"""

from __future__ import annotations

import sys


def prefer_installed_pyspark(path: list[str]) -> list[str]:
    """`path` with Spark's bundled zips (pyspark.zip, py4j-*.zip) moved to the end."""
    bundled = [p for p in path if p.endswith(".zip") and "pyspark" in p.replace("\\", "/")]
    return [p for p in path if p not in bundled] + bundled


if __name__ == "__main__":
    sys.path[:] = prefer_installed_pyspark(sys.path)
    from pyspark import daemon

    import replicator.transfer.copy_stream  # noqa: F401  (see the docstring)

    daemon.manager()
