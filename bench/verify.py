"""Verification benchmark: `replicator verify` against hashing every row of both tables once.

Builds an N-row table, loads it with replicator, then per round damages 0.01% of the
destination's rows (a third changed, a third deleted, a third extra rows) and times:
- the baseline: one query per side, run concurrently through `psql`, that hashes every row
  (`md5(string_agg(md5(t::text), '' ORDER BY id))`): what proving two tables equal costs
  with no tool at all, and it cannot say which rows differ;
- `replicator verify` (exit 1: differences found), with Spark (the default for a table this
  size) and in-process (`REPLICATOR_SPARK_MIN_ROWS` above the table);
- `replicator verify --repair` on the same damage (exit 0), so `repair - verify` is what
  fixing the rows adds.
Prints medians, peak RSS of the whole process tree and the ratios.

    .venv/bin/python bench/verify.py --rows 5000000 --repeat 2
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
from incremental import DDL, fill

from replicator.postgres.pgcluster import PgCluster, find_pg_bin

HASH_ALL = "SELECT md5(string_agg(md5(t::text), '' ORDER BY id)) FROM bench_orders t"
HASH_KEYS = "SELECT md5(string_agg(md5(id::text), '' ORDER BY id)) FROM bench_orders"


def build(source_url: str, rows: int) -> None:
    with psycopg.connect(source_url, autocommit=True) as conn:
        conn.execute(DDL)
        fill(conn, rows)
        conn.execute("VACUUM ANALYZE bench_orders")


def damage(dest_url: str, rows: int, round_no: int) -> int:
    """Change, delete and add 0.01% of the rows in all (spread over the key range, never
    the newest rows, which the cursor would count as not yet synced)."""
    each = max(rows // 30_000, 1)
    step = (rows - 1000) // each
    ids = [1 + round_no + i * step for i in range(each)]
    with psycopg.connect(dest_url, autocommit=True) as conn:
        conn.execute("UPDATE bench_orders SET note = 'damaged' WHERE id = ANY(%s)", (ids,))
        conn.execute("DELETE FROM bench_orders WHERE id = ANY(%s)", ([i + 7 for i in ids],))
        conn.execute(
            "INSERT INTO bench_orders SELECT id + %s, customer_id, note, amount, payload, "
            "updated_at FROM bench_orders WHERE id = ANY(%s)",
            (rows * 2, ids),
        )
    return 3 * each


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=5_000_000)
    parser.add_argument("--repeat", type=int, default=2)
    args = parser.parse_args()
    psql = shlex.quote(str(find_pg_bin() / "psql"))
    base = Path(tempfile.mkdtemp(prefix="replicator-bench-verify-"))
    source, dest = PgCluster(base / "source"), PgCluster(base / "dest")
    try:
        source.start()
        dest.start()
        print(f"building {args.rows:,} rows ...", flush=True)
        build(source.url(), args.rows)
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
                            "deletes": "delete",
                        }
                    ]
                }
            )
        )
        env = {
            **os.environ,
            "REPLICATOR_SOURCE_URL": source.url(),
            "REPLICATOR_DEST_URL": dest.url(),
        }
        in_process = {**env, "REPLICATOR_SPARK_MIN_ROWS": str(args.rows * 10)}
        cli = f"{shlex.quote(sys.executable)} -m replicator"
        where = f"--project-dir {shlex.quote(str(project))}"
        first = run_measured(f"{cli} sync -q {where}", env)
        print(f"  initial full load: {first.seconds:.1f} s", flush=True)
        with psycopg.connect(dest.url(), autocommit=True) as conn:
            conn.execute("VACUUM ANALYZE bench_orders")
        src, dst = shlex.quote(source.url()), shlex.quote(dest.url())
        baseline = (
            f"{psql} {src} -Atc {shlex.quote(HASH_ALL)} > /dev/null & "
            f"{psql} {dst} -Atc {shlex.quote(HASH_ALL)} > /dev/null & wait"
        )
        verify = f"{cli} verify -q --json {where} > /dev/null"
        results: dict[str, list[Measured]] = {
            "baseline: md5 of every row, both sides at once": [],
            "replicator verify (Spark)": [],
            "replicator verify (in-process)": [],
            "replicator verify --repair (Spark)": [],
        }
        expected = {
            "replicator verify (Spark)": 1,
            "replicator verify (in-process)": 1,
            "replicator verify --repair (Spark)": 0,
        }
        for round_no in range(args.repeat):
            damaged = damage(dest.url(), args.rows, round_no)
            runs = {
                "baseline: md5 of every row, both sides at once": (baseline, env),
                "replicator verify (Spark)": (verify, env),
                "replicator verify (in-process)": (verify, in_process),
                "replicator verify --repair (Spark)": (
                    f"{cli} verify --repair -q --json {where} > /dev/null",
                    env,
                ),
            }
            for name, (command, environment) in runs.items():
                measured = run_measured(command, environment)
                if measured.returncode != expected.get(name, 0):
                    raise SystemExit(f"{name}: exit {measured.returncode}")
                results[name].append(measured)
            print(
                f"  round {round_no + 1} ({damaged:,} rows damaged): "
                + ", ".join(f"{k}: {v[-1].seconds:.2f} s" for k, v in results.items()),
                flush=True,
            )
        check = run_measured(f"{cli} verify -q {where} > /dev/null", env)
        if check.returncode != 0:
            raise SystemExit("after --repair, verify still finds differences")
        print("  after --repair: verify finds the tables equal")
        keys = (
            f"{psql} {src} -Atc {shlex.quote(HASH_KEYS)} > /dev/null & "
            f"{psql} {dst} -Atc {shlex.quote(HASH_KEYS)} > /dev/null & wait"
        )
        deletes: dict[str, list[Measured]] = {
            "baseline: md5 of every key, both sides at once": [],
            "replicator sync --deletes (no-op + key-only delete check)": [],
        }
        commands = [keys, f"{cli} sync --deletes -q {where}"]
        for _ in range(args.repeat + 1):
            for name, command in zip(deletes, commands, strict=True):
                measured = run_measured(command, env)
                if measured.returncode != 0:
                    raise SystemExit(f"{name}: exit {measured.returncode}")
                deletes[name].append(measured)
        report(results, args.rows)
        report_deletes(deletes, args.rows)
    finally:
        source.destroy()
        dest.destroy()
        shutil.rmtree(base, ignore_errors=True)


def report(results: dict[str, list[Measured]], rows: int) -> None:
    print(f"\n{rows:,} rows, 0.01% ({rows // 10_000:,}) damaged per round, {os.cpu_count()} cores")
    medians = table(results, "baseline: md5 of every row, both sides at once")
    repair = medians["replicator verify --repair (Spark)"] - medians["replicator verify (Spark)"]
    print(f"\n--repair adds {repair:.2f} s to verify (Spark)")


def report_deletes(results: dict[str, list[Measured]], rows: int) -> None:
    print(f"\nkey-only delete check of an unchanged {rows:,}-row table")
    table(results, "baseline: md5 of every key, both sides at once")


def table(results: dict[str, list[Measured]], baseline_name: str) -> dict[str, float]:
    """A markdown table of medians, runs, peak RSS and the ratio to the baseline."""
    medians = {name: statistics.median(m.seconds for m in runs) for name, runs in results.items()}
    print("| path | wall (median) | runs | peak RSS | / baseline |")
    print("|---|---|---|---|---|")
    for name, runs in results.items():
        print(
            f"| {name} | {medians[name]:.2f} s | "
            f"{', '.join(f'{m.seconds:.2f}' for m in runs)} | "
            f"{max(m.peak_rss_mb for m in runs):,.0f} MB | "
            f"{medians[name] / medians[baseline_name]:.2f}x |"
        )
    return medians


if __name__ == "__main__":
    main()
