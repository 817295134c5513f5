"""Many small tables: what a project of 1,000 tables costs per run, against one of 10.

On two throwaway clusters, `--tables` small tables (a key, a timestamp cursor, a note; `--rows`
rows each) in schema `many`, selected by one pattern entry (`"many.*"`). Timed, each as its own
`replicator` process (as cron runs it), for the small project and the large one:

1. the first sync (every table loaded in this process: tables far below `spark.min_rows`);
2. a no-op sync (nothing changed: every table probed, none copied);
3. `status`, `check`, `compile` and `ls`.

Printed: seconds for each, and the ratio of the large project to the small one. The target:
the no-op run of 1,000 tables within 3x the no-op run of 10.

With `--deletes`, the large project's no-op run is then timed with `"deletes": "delete"` on
its pattern against the same run without, three rounds each, alternated (the target: at
most 1.3x): a quiet table's delete check is one row count a side, fifty tables a statement.

Each command starts on a settled machine: both clusters checkpointed and every dirty page
written out (`sync`). Without that, a command run just after the first sync of 1,000 tables
waits on the write-back of the data that sync left behind (the clusters and the project share
one file system here): a no-op run's 1,000 state files took 1.6-1.8 s to write, and
0.45-0.73 s once settled.

    .venv/bin/python bench/many_tables.py --tables 1000 --small 10
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psycopg
from psycopg import sql

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from replicator.postgres.pgcluster import PgCluster

COMMANDS = (
    ("first sync", ("sync", "-q")),
    ("no-op sync", ("sync", "-q")),
    ("status", ("status", "--json")),
    ("check", ("check", "-q")),
    ("compile", ("compile", "--json")),
    ("ls", ("ls", "--json")),
)


def make_tables(url: str, schema: str, count: int, rows: int) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(schema)))
        with conn.transaction():
            for i in range(count):
                table = sql.Identifier(schema, f"t_{i:04d}")
                conn.execute(
                    sql.SQL(
                        "CREATE TABLE {} (id int PRIMARY KEY, note text, "
                        "updated_at timestamptz NOT NULL DEFAULT now())"
                    ).format(table)
                )
                conn.execute(
                    sql.SQL(
                        "INSERT INTO {} (id, note) SELECT g, 'n' || g FROM generate_series(1, %s) g"
                    ).format(table),
                    (rows,),
                )
        conn.execute("ANALYZE")


def settle(*urls: str) -> None:
    """Checkpoint each cluster, then write every dirty page out (see above)."""
    for url in urls:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("CHECKPOINT")
    os.sync()


def _configure(folder: Path, schema: str, **extra: str) -> None:
    entry = {"name": f"{schema}.*", "replication_key": "updated_at", **extra}
    (folder / "tables-config.json").write_text(json.dumps({"tables": [entry]}))


def _timed(folder: Path, source: str, dest: str, label: str, args: tuple[str, ...]) -> float:
    env = {
        **os.environ,
        "REPLICATOR_SOURCE_URL": source,
        "REPLICATOR_DEST_URL": dest,
        "REPLICATOR_SPARK_MIN_ROWS": "100000000",
    }
    settle(source, dest)
    started = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "replicator", *args, "--project-dir", str(folder)],
        env=env,
        capture_output=True,
        text=True,
    )
    seconds = time.perf_counter() - started
    if done.returncode not in (0,) and not (label == "check" and done.returncode == 1):
        raise SystemExit(f"{label} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return seconds


def timed_project(folder: Path, source: str, dest: str, schema: str) -> dict[str, float]:
    folder.mkdir()
    (folder / "sync-state").mkdir()
    _configure(folder, schema)
    return {label: _timed(folder, source, dest, label, args) for label, args in COMMANDS}


def timed_deletes(folder: Path, source: str, dest: str, schema: str) -> tuple[float, float]:
    """The best of three no-op runs without `deletes` and with `"deletes": "delete"`."""
    without, with_deletes = [], []
    _configure(folder, schema, deletes="delete")
    _timed(folder, source, dest, "first delete check", ("sync", "-q"))
    for _ in range(3):
        _configure(folder, schema)
        without.append(_timed(folder, source, dest, "no-op", ("sync", "-q")))
        _configure(folder, schema, deletes="delete")
        with_deletes.append(_timed(folder, source, dest, "no-op with deletes", ("sync", "-q")))
    return min(without), min(with_deletes)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tables", type=int, default=1000)
    parser.add_argument("--small", type=int, default=10)
    parser.add_argument("--rows", type=int, default=20)
    parser.add_argument("--deletes", action="store_true", help="also time deletes: delete")
    args = parser.parse_args()
    base = Path(tempfile.mkdtemp(prefix="replicator-many-"))
    clusters = [PgCluster(base / "source").start(), PgCluster(base / "dest").start()]
    try:
        source, dest = clusters[0].url(), clusters[1].url()
        results = {}
        for count in (args.small, args.tables):
            schema = f"many_{count}"
            make_tables(source, schema, count, args.rows)
            results[count] = timed_project(base / f"project_{count}", source, dest, schema)
        small, large = results[args.small], results[args.tables]
        print(f"| command | {args.small} tables | {args.tables} tables | ratio |")
        print("|---|---|---|---|")
        for label, _ in COMMANDS:
            print(
                f"| {label} | {small[label]:.2f} s | {large[label]:.2f} s | "
                f"{large[label] / small[label]:.1f}x |"
            )
        if args.deletes:
            plain, deleting = timed_deletes(
                base / f"project_{args.tables}", source, dest, f"many_{args.tables}"
            )
            print(
                f"\nno-op of {args.tables} tables: {plain:.2f} s; with deletes: delete "
                f"{deleting:.2f} s ({deleting / plain:.2f}x)"
            )
    finally:
        for cluster in clusters:
            cluster.destroy()
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
