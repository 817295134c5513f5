"""What the one-table benchmarks share (copy_objects.py, schema_evolution.py): two throwaway
clusters, a settled machine before each timed command, a `replicator sync` as its own
process (as cron runs it), and the check that the copy is the source's rows."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from replicator.postgres.pgcluster import PgCluster

# The rows of bench/full_load.py's table, in key order.
DIGEST = "SELECT count(*), md5(string_agg(md5(o::text), '' ORDER BY id)) FROM bench_orders o"


@contextlib.contextmanager
def two_clusters(prefix: str) -> Iterator[tuple[Path, str, str]]:
    """A folder, and the URLs of a source and a destination cluster, removed afterwards."""
    base = Path(tempfile.mkdtemp(prefix=prefix))
    clusters = [PgCluster(base / "source").start(), PgCluster(base / "dest").start()]
    try:
        yield base, clusters[0].url(), clusters[1].url()
    finally:
        for cluster in clusters:
            cluster.destroy()
        shutil.rmtree(base, ignore_errors=True)


def settle(*urls: str) -> None:
    """Vacuum and checkpoint each cluster and write every dirty page out: a timed command
    must not pay for the write-back of what the one before it left, nor wait for the
    autovacuum it set off (a reloaded copy of 5M rows gets one; a timed ALTER's lock waits
    deadlock_timeout, a second, for it to be cancelled)."""
    for url in urls:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("VACUUM")
            conn.execute("CHECKPOINT")
    os.sync()


def timed_sync(project: Path, env: dict[str, str], *args: str) -> tuple[float, str]:
    """`replicator sync <args>` as its own process: its seconds and its log."""
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "replicator", "sync", *args, "--project-dir", str(project)],
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
    )
    seconds = time.monotonic() - started
    if done.returncode != 0:
        raise SystemExit(f"sync failed ({done.returncode}):\n{done.stderr}")
    return seconds, done.stderr


def same(source: str, dest: str) -> None:
    """The copy holds exactly the source's rows, or the benchmark stops."""
    with psycopg.connect(source) as s, psycopg.connect(dest) as d:
        if s.execute(DIGEST).fetchone() != d.execute(DIGEST).fetchone():
            raise SystemExit("the copy differs from the source")
