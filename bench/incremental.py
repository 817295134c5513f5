"""Incremental-sync benchmark: replicator against the same work done by hand in SQL.

Builds an N-row table with an index on `updated_at`, loads it once with replicator, then per
round changes 1% of the rows (new rows each round) and times either `replicator sync` or the
hand-written baseline (`psql` COPY of the changed rows into a staging table, then
`INSERT ... ON CONFLICT DO UPDATE`), alternating; and a no-op `replicator sync`. Prints
medians, peak RSS and ratios. The project uses `lookback: 0`: every round's changes are
written within a second, which a 5 s lookback would re-read next round (in production the
lookback re-reads only the last seconds of a cron interval).

    .venv/bin/python bench/incremental.py --rows 5000000 --repeat 2
    .venv/bin/python bench/incremental.py --rows 5000000 --repeat 3 --spark

`--spark` adds two rows, each with its own 1% round: the batch through a cold local Spark
(spark.min_rows 0: the run starts its JVM) and with the project's warm Spark server up
(`replicator spark start` before the rounds; spark.min_rows unset, so the run picks the
engine as spark/engine_choice.py says: the server must never make a run slower than the
in-process copy, whether or not the run uses it). The in-process
and cold runs use another cache folder, where no warm server is recorded (so they do not
find it), with the JVM's class archive built by an untimed run first, as on any machine
that ran Spark before.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

import psycopg
from procwatch import Measured, run_measured

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from replicator.postgres.pgcluster import PgCluster, find_pg_bin

DDL = """
CREATE TABLE bench_orders (
  id bigint PRIMARY KEY, customer_id int NOT NULL, note text, amount numeric(12,2),
  payload jsonb, updated_at timestamptz NOT NULL)
"""
# A second of updated_at per row, the newest a day before the build: every later change
# (clock_timestamp()) is newer than any row, at any size, so the cursor never runs ahead.
FILL = """
INSERT INTO bench_orders
SELECT g, g %% 100000, 'order note ' || md5(g::text) || md5((g + 1)::text),
       (g %% 100000) / 100.0, jsonb_build_object('id', g, 'ok', g %% 2 = 0),
       now() - interval '1 day' - (%(rows)s - g) * interval '1 second'
FROM generate_series(%(low)s, %(high)s) g
"""


def fill(conn: psycopg.Connection, rows: int) -> None:
    """`rows` rows into an empty bench_orders, a million a statement."""
    for low in range(1, rows + 1, 1_000_000):
        conn.execute(FILL, {"rows": rows, "low": low, "high": min(rows, low + 999_999)})


CHANGE = (
    "UPDATE bench_orders SET amount = amount + 1, updated_at = clock_timestamp() "
    "WHERE id %% 100 = %s"
)
MERGE = """
INSERT INTO bench_orders SELECT * FROM stage
ON CONFLICT (id) DO UPDATE SET customer_id = EXCLUDED.customer_id, note = EXCLUDED.note,
  amount = EXCLUDED.amount, payload = EXCLUDED.payload, updated_at = EXCLUDED.updated_at;
TRUNCATE stage;
"""


COLD = "replicator sync (1% changed, cold local Spark)"
WARM = "replicator sync (1% changed, the warm Spark server up)"


def build(source_url: str, dest_url: str, rows: int) -> None:
    with psycopg.connect(source_url, autocommit=True) as conn:
        conn.execute(DDL)
        fill(conn, rows)
        conn.execute("CREATE INDEX ON bench_orders (updated_at)")
        conn.execute("VACUUM ANALYZE bench_orders")
    with psycopg.connect(dest_url, autocommit=True) as conn:
        stage = DDL.replace("CREATE TABLE bench_orders", "CREATE UNLOGGED TABLE stage")
        conn.execute(stage.replace(" PRIMARY KEY", ""))


def change(source_url: str, round_no: int) -> str:
    """Change 1% of the rows; return the source time just before (the baseline's cursor)."""
    with psycopg.connect(source_url, autocommit=True) as conn:
        (before,) = conn.execute("SELECT now()::text").fetchone()
        conn.execute(CHANGE, (round_no % 100,))
    return before


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=5_000_000)
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--spark", action="store_true", help="add cold and warm Spark rows")
    args = parser.parse_args()
    psql = shlex.quote(str(find_pg_bin() / "psql"))
    base = Path(tempfile.mkdtemp(prefix="replicator-bench-inc-"))
    source, dest = PgCluster(base / "source", logical=True), PgCluster(base / "dest")
    try:
        source.start()
        dest.start()
        print(f"building {args.rows:,} rows ...", flush=True)
        build(source.url(), dest.url(), args.rows)
        project = base / "project"
        (project / "sync-state").mkdir(parents=True)
        (project / "tables-config.json").write_text(
            json.dumps(
                {
                    "tables": [
                        {
                            "name": "public.bench_orders",
                            "replication_key": "updated_at",
                            "lookback": 0,
                        }
                    ]
                }
            )
        )
        env = {
            **os.environ,
            "REPLICATOR_SOURCE_URL": source.url(),
            "REPLICATOR_DEST_URL": dest.url(),
            "REPLICATOR_CACHE_DIR": str(base / "cache"),
        }
        env.pop("REPLICATOR_SPARK_MIN_ROWS", None)
        warm_env = {**env, "REPLICATOR_CACHE_DIR": str(base / "warm-cache")}
        cold_env = {**env, "REPLICATOR_SPARK_MIN_ROWS": "0"}
        cli = f"{shlex.quote(sys.executable)} -m replicator"
        where = f"--project-dir {shlex.quote(str(project))}"
        sync = f"{cli} sync -q {where}"
        first = run_measured(sync, env)
        print(f"  initial full load: {first.seconds:.1f} s", flush=True)
        src, dst = shlex.quote(source.url()), shlex.quote(dest.url())
        results: dict[str, list[Measured]] = {
            "replicator sync (1% changed)": [],
            "SQL by hand (1% changed)": [],
            "replicator sync (no-op)": [],
        }
        if args.spark:
            results[COLD] = []
            results[WARM] = []
            if run_measured(f"{cli} spark start -q {where}", warm_env).returncode != 0:
                raise SystemExit("replicator spark start failed")
        round_no = 1
        if args.spark:  # untimed: the JVM's class archive, as after any earlier Spark run
            change(source.url(), round_no)
            round_no += 1
            run_measured(sync, cold_env)
        for _ in range(args.repeat):
            change(source.url(), round_no)
            round_no += 1
            results["replicator sync (1% changed)"].append(run_measured(sync, env))
            results["replicator sync (no-op)"].append(run_measured(sync, env))
            since = change(source.url(), round_no)
            round_no += 1
            copy_out = (
                f"\\copy (SELECT * FROM bench_orders WHERE updated_at >= "
                f"'{since}'::timestamptz) TO STDOUT"
            )
            by_hand = (
                f"{psql} {src} -c {shlex.quote(copy_out)} | "
                f"{psql} {dst} -c '\\copy stage FROM STDIN' && "
                f"{psql} {dst} -v ON_ERROR_STOP=1 -c {shlex.quote(MERGE)}"
            )
            results["SQL by hand (1% changed)"].append(run_measured(by_hand, env))
            run_measured(sync, env)  # untimed: replicator catches up with those changes
            if args.spark:
                for name, spark_env in ((COLD, cold_env), (WARM, warm_env)):
                    change(source.url(), round_no)
                    round_no += 1
                    results[name].append(run_measured(sync, spark_env))
            for name, runs in results.items():
                if runs and runs[-1].returncode != 0:
                    raise SystemExit(f"{name} failed")
            print(
                "  " + ", ".join(f"{k}: {v[-1].seconds:.1f} s" for k, v in results.items()),
                flush=True,
            )
        verify(source.url(), dest.url())
        report(results, args.rows)
    finally:
        if args.spark:
            run_measured(f"{cli} spark stop -q {where}", warm_env)
        source.destroy()
        dest.destroy()
        shutil.rmtree(base, ignore_errors=True)


def verify(source_url: str, dest_url: str) -> None:
    """The benchmark counts only if both sides end identical."""
    query = "SELECT count(*), md5(string_agg(md5(t::text), '' ORDER BY id)) FROM bench_orders t"
    with psycopg.connect(source_url) as s, psycopg.connect(dest_url) as d:
        if s.execute(query).fetchone() != d.execute(query).fetchone():
            raise SystemExit("source and destination differ")
    print("  verified: source and destination identical (md5 of every row)")


def report(results: dict[str, list[Measured]], rows: int) -> None:
    medians = {name: statistics.median(m.seconds for m in runs) for name, runs in results.items()}
    ours, baseline = medians["replicator sync (1% changed)"], medians["SQL by hand (1% changed)"]
    print(f"\n{rows:,} rows, 1% ({rows // 100:,}) changed per round, {os.cpu_count()} cores")
    print("| path | wall (median) | runs | peak RSS (the run's processes) |")
    print("|---|---|---|---|")
    for name, runs in results.items():
        print(
            f"| {name} | {medians[name]:.2f} s | "
            f"{', '.join(f'{m.seconds:.2f}' for m in runs)} | "
            f"{max(m.peak_rss_mb for m in runs):,.0f} MB |"
        )
    print(
        f"\nreplicator / SQL by hand: {ours / baseline:.2f}x; "
        f"no-op run: {medians['replicator sync (no-op)']:.2f} s"
    )
    if WARM in medians:
        print(
            f"with the warm server up / in-process: {medians[WARM] / ours:.2f}x "
            f"(target: never slower); cold local Spark / in-process: {medians[COLD] / ours:.2f}x"
        )


if __name__ == "__main__":
    main()
