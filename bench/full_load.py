"""Full-load benchmark: replicator against the psql COPY pipes and pg_dump | psql.

Starts two throwaway PostgreSQL clusters, builds an N-row table (bigint key, timestamptz,
int, text, numeric(12,2), jsonb), then times each path at least twice into a fresh
destination table and prints wall time, rows/s, MB/s, peak RSS of the whole process tree
and the ratio of replicator to each baseline (medians). Baselines load into a table without
a primary key (pure data movement); replicator also builds the key, analyzes and swaps.
One extra row loads the dump into a table with its key in place, for context; replicator
runs with its defaults (one Spark task per core), with the table setting `partitions: 1`
(one task, which copies frozen) and, for context, without Spark (`spark.min_rows` above the
table: the process runs the same copy task itself).

`--spark` adds the in-process row (if `--only` left it out) and a row forced through local Spark
(`spark.min_rows` 0, `local[*]`: what a cluster user's copy costs on top of the rows, with its
driver JVM and Python workers in the peak RSS), with the ratio of the one to the other.
`--cluster` adds a row on a Spark standalone cluster started here (a master and two workers
of 1 core, whose Python is the system python3: the run ships its environment). `--resume`
adds two rows for a cursor table cut in 10 partitions: a fresh load, and the run that
resumes a load killed (SIGKILL) once 8 of its partitions were in. `--against REV` adds a row
for replicator as of git revision REV (checked out in a worktree here, run through
PYTHONPATH with the same project and Python): the A/B of a change to the copy path, such as
the move of the Spark tasks from RDDs to the DataFrame API (`--against ba74b11`).

    .venv/bin/python bench/full_load.py --rows 5000000 --repeat 2
    .venv/bin/python bench/full_load.py --rows 5000000 --only replicator --cluster --resume
    .venv/bin/python bench/full_load.py --rows 5000000 --only replicator --spark --repeat 3
    .venv/bin/python bench/full_load.py --rows 5000000 --only replicator --against ba74b11
    .venv/bin/python bench/full_load.py --rows 10000000 --only replicator \\
        --spark-conf spark.driver.memory=1g
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psycopg
from procwatch import Measured, run_measured

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from spark_cluster import SparkCluster  # the test suite's standalone cluster

from replicator.postgres.pgcluster import PgCluster, find_pg_bin

TABLE_DDL = """
CREATE TABLE bench_orders (
  id bigint PRIMARY KEY, created_at timestamptz NOT NULL, customer_id int NOT NULL,
  note text, amount numeric(12,2), payload jsonb)
"""
# About 350 bytes a row: 5M rows make a 1.7 GB table.
FILL = """
INSERT INTO bench_orders
SELECT g, timestamptz '2026-01-01' + g * interval '1 second', g %% 100000,
       'order note ' || md5(g::text) || md5((g + 1)::text) || md5((g + 2)::text),
       (g %% 100000) / 100.0,
       jsonb_build_object('id', g, 'customer', 'customer-' || (g %% 100000),
                          'tags', jsonb_build_array('alpha', 'beta', 'gamma'),
                          'ok', g %% 2 = 0, 'comment', md5(g::text) || md5((g * 3)::text))
FROM generate_series(%s, %s) g
"""
DEST_DDL = TABLE_DDL.replace("PRIMARY KEY", "")
# Context, not a target: the same dump loaded into a table that keeps its primary key, as a
# replica must (replicator builds the key after its load).
KEYED = "pg_dump | psql, key in place"


OURS = "replicator sync"
# One task per table: it empties the side table in its own transaction and copies frozen;
# the table setting `partitions: 1` (the default is one task per core).
SINGLE = "replicator sync, partitions: 1"
# Context, not the design: `spark.min_rows` above the table, so the replicator process runs
# the same copy task itself and no JVM starts. It shows what Spark's start costs here.
IN_PROCESS = "replicator sync, no Spark (spark.min_rows above the table)"
FORCED = "replicator sync, forced through local Spark (spark.min_rows 0)"
CLUSTER = "replicator sync, standalone cluster (2 workers x 1 core)"
FRESH = "replicator sync, cursor table, 10 partitions: fresh load"
RESUMED = "replicator sync, same: resumed after a kill at 8 of 10 partitions"
AGAINST = "replicator sync at {rev}"
OURS_ROWS = (OURS, SINGLE, IN_PROCESS, FORCED, CLUSTER, FRESH, RESUMED)
KILL_AT_PARTS = 8


def write_project(
    folder: Path,
    conf: dict[str, str],
    partitions: int | None,
    min_rows: int | None = None,
    master: str | None = None,
    cursor: bool = False,
) -> Path:
    (folder / "sync-state").mkdir(parents=True)
    table: dict = {"name": "public.bench_orders", "mode": "full-refresh"}
    if cursor:  # resumable: a cursor table's load
        table = {"name": "public.bench_orders", "replication_key": "created_at"}
    if partitions:
        table["partitions"] = partitions
    spark: dict = {"conf": conf}
    if master:
        spark["master"] = master
    if min_rows is not None:
        spark["min_rows"] = min_rows
    (folder / "tables-config.json").write_text(json.dumps({"tables": [table], "spark": spark}))
    return folder


def sync_command(project: Path) -> str:
    python, folder = shlex.quote(sys.executable), shlex.quote(str(project))
    return f"{python} -m replicator sync -q --project-dir {folder}"


def build_source(url: str, rows: int) -> int:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(TABLE_DDL)
        step = 1_000_000
        for low in range(1, rows + 1, step):
            conn.execute(FILL, (low, min(rows, low + step - 1)))
        conn.execute("VACUUM ANALYZE bench_orders")
        (size,) = conn.execute("SELECT pg_relation_size('bench_orders')").fetchone()
    return size


def fresh_destination(url: str, table: str | None) -> None:
    """No bench_orders (nor replicator's bookkeeping) in the destination; then `table`, the
    empty table a baseline loads into. replicator creates its own: it never replaces a
    table it did not create."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("DROP TABLE IF EXISTS bench_orders")
        conn.execute("DROP SCHEMA IF EXISTS _replicator CASCADE")
        if table is not None:
            conn.execute(table)
        conn.execute("CHECKPOINT")


def kill_part_way(command: str, env: dict[str, str], dest_url: str) -> None:
    """Start the load, SIGKILL it (and its JVM) once KILL_AT_PARTS partitions committed."""
    run = subprocess.Popen(
        ["bash", "-c", command], env=env, stdin=subprocess.DEVNULL, start_new_session=True
    )
    with psycopg.connect(dest_url, autocommit=True) as conn:
        while run.poll() is None:
            (ready,) = conn.execute(
                "SELECT to_regclass('_replicator.loaded_partitions') IS NOT NULL"
            ).fetchone()
            done = (
                conn.execute("SELECT count(*) FROM _replicator.loaded_partitions").fetchone()[0]
                if ready
                else 0
            )
            if done >= KILL_AT_PARTS:
                os.killpg(run.pid, signal.SIGKILL)
                break
            time.sleep(0.05)
    if run.wait() != -signal.SIGKILL:
        raise SystemExit("the load ended before it could be killed part-way")


def count_rows(url: str) -> int:
    with psycopg.connect(url) as conn:
        return conn.execute("SELECT count(*) FROM bench_orders").fetchone()[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=5_000_000)
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--only", choices=["replicator"], help="skip the baselines")
    parser.add_argument("--spark-conf", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument(
        "--partitions", type=int, help="replicator sync: Spark tasks (default: one per core)"
    )
    parser.add_argument("--spark", action="store_true", help="add the forced local Spark row")
    parser.add_argument("--cluster", action="store_true", help="add the standalone cluster row")
    parser.add_argument("--resume", action="store_true", help="add the resumed-load rows")
    parser.add_argument("--against", metavar="REV", help="add a row for replicator at REV")
    args = parser.parse_args()

    pg_bin = find_pg_bin()
    psql, pg_dump = shlex.quote(str(pg_bin / "psql")), shlex.quote(str(pg_bin / "pg_dump"))
    base = Path(tempfile.mkdtemp(prefix="replicator-bench-"))
    source, dest = PgCluster(base / "source", logical=True), PgCluster(base / "dest")
    spark_cluster = SparkCluster(base / "spark") if args.cluster else None
    try:
        source.start()
        dest.start()
        if spark_cluster is not None:
            spark_cluster.start()
        src, dst = shlex.quote(source.url()), shlex.quote(dest.url())
        print(f"building {args.rows:,} rows ...", flush=True)
        table_bytes = build_source(source.url(), args.rows)
        conf = dict(item.split("=", 1) for item in args.spark_conf)
        project = write_project(base / "project", conf, args.partitions)
        single = write_project(base / "project-single", conf, 1)
        # reltuples is an estimate: well above the table, so that no JVM starts.
        in_process = write_project(base / "project-in-process", conf, None, args.rows * 10)
        env = {
            **os.environ,
            "REPLICATOR_SOURCE_URL": source.url(),
            "REPLICATOR_DEST_URL": dest.url(),
        }
        copy_out = "\\copy bench_orders TO STDOUT"
        copy_in = "\\copy bench_orders FROM STDIN"
        binary = " (FORMAT binary)"
        paths = {
            "psql COPY pipe (text)": f"{psql} {src} -c '{copy_out}' | {psql} {dst} -c '{copy_in}'",
            "psql COPY pipe (binary)": (
                f"{psql} {src} -c '{copy_out}{binary}' | {psql} {dst} -c '{copy_in}{binary}'"
            ),
            "pg_dump | psql": f"{pg_dump} -t bench_orders --data-only {src} | {psql} -q {dst}",
            KEYED: f"{pg_dump} -t bench_orders --data-only {src} | {psql} -q {dst}",
            OURS: sync_command(project),
            SINGLE: sync_command(single),
            IN_PROCESS: sync_command(in_process),
        }
        if args.only:
            paths = {OURS: paths[OURS]}
        if args.spark:
            paths[IN_PROCESS] = sync_command(in_process)
            paths[FORCED] = sync_command(write_project(base / "project-forced", conf, None, 0))
        if spark_cluster is not None:
            wait_for_cores = {
                "spark.cores.max": "2",
                "spark.scheduler.minRegisteredResourcesRatio": "1.0",
                "spark.executor.memory": "1g",
            }
            on_cluster = write_project(
                base / "project-cluster",
                {**conf, **wait_for_cores},
                args.partitions,
                None,
                spark_cluster.url,
            )
            paths[CLUSTER] = sync_command(on_cluster)
        against = AGAINST.format(rev=args.against) if args.against else None
        if against is not None:
            # From the worktree: `python -m` puts the working folder first on the path.
            folder = checkout(args.against, base)
            paths[against] = f"cd {folder} && PYTHONPATH={folder} {sync_command(project)}"
        if args.resume:
            resumable = write_project(base / "project-resumable", conf, 10, cursor=True)
            paths[FRESH] = paths[RESUMED] = sync_command(resumable)
        results: dict[str, list[Measured]] = {name: [] for name in paths}
        for attempt in range(args.repeat):
            for name, command in paths.items():
                baseline = name not in OURS_ROWS and name != against
                ddl = TABLE_DDL if name == KEYED else DEST_DDL
                fresh_destination(dest.url(), ddl if baseline else None)
                for state in (base / "project-resumable" / "sync-state").glob("*.json"):
                    state.unlink()  # the cursor table's load is a first load each time
                if name == RESUMED:
                    kill_part_way(command, env, dest.url())
                measured = run_measured(command, env)
                copied = count_rows(dest.url()) if measured.returncode == 0 else -1
                if copied != args.rows:
                    raise SystemExit(f"{name}: exit {measured.returncode}, {copied} rows copied")
                results[name].append(measured)
                print(
                    f"  run {attempt + 1} {name}: {measured.seconds:.1f} s, "
                    f"peak {measured.peak_rss_mb:.0f} MB",
                    flush=True,
                )
        report(results, args.rows, table_bytes)
    finally:
        if spark_cluster is not None:
            spark_cluster.stop()
        for worktree in base.glob("at-*"):
            repo = str(Path(__file__).resolve().parents[1])
            subprocess.run(["git", "-C", repo, "worktree", "remove", "--force", str(worktree)])
        source.destroy()
        dest.destroy()
        shutil.rmtree(base, ignore_errors=True)


def report(results: dict[str, list[Measured]], rows: int, table_bytes: int) -> None:
    medians = {name: statistics.median(m.seconds for m in runs) for name, runs in results.items()}
    ours, single = medians[OURS], medians.get(SINGLE)
    print(f"\n{rows:,} rows, {table_bytes / 1e9:.2f} GB on disk, {os.cpu_count()} cores")
    print(
        "| path | wall (median) | runs | rows/s | MB/s (heap) | peak RSS | replicator / this "
        "| replicator, partitions: 1 / this |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for name, runs in results.items():
        median = medians[name]
        print(
            f"| {name} | {median:.1f} s | {', '.join(f'{m.seconds:.1f}' for m in runs)} | "
            f"{rows / median:,.0f} | {table_bytes / 1e6 / median:,.0f} | "
            f"{max(m.peak_rss_mb for m in runs):,.0f} MB | {ours / median:.2f}x | "
            f"{f'{single / median:.2f}x' if single else '-'} |"
        )
    if RESUMED in medians:
        print(f"\nresumed / fresh load: {medians[RESUMED] / medians[FRESH]:.2f}x")
    if FORCED in medians:
        ratio = medians[FORCED] / medians[IN_PROCESS]
        print(f"forced through local Spark / in this process: {ratio:.2f}x")
    if CLUSTER in medians:
        print(f"standalone cluster / local[*]: {medians[CLUSTER] / ours:.2f}x")
    for name in medians:
        if name.startswith(AGAINST.format(rev="")):
            rev = name.removeprefix("replicator sync ")
            print(f"this checkout / replicator {rev}: {ours / medians[name]:.2f}x")


def checkout(rev: str, base: Path) -> str:
    """A worktree of the repository at `rev`, for PYTHONPATH (removed with the run's folder;
    `git worktree prune` forgets it)."""
    folder = base / f"at-{rev}"
    repo = Path(__file__).resolve().parents[1]
    subprocess.run(
        ["git", "-C", str(repo), "worktree", "add", "--detach", str(folder), rev],
        check=True,
        capture_output=True,
    )
    return shlex.quote(str(folder))


if __name__ == "__main__":
    main()
