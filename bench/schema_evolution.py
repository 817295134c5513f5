"""A source schema change taken in place (`on_schema_change: "evolve"`) against a full
reload of the same table, in the same run.

On two throwaway clusters, the N-row table of bench/full_load.py (about 350 bytes a row) is a
cursor table (`replication_key: created_at`, indexed in the source as `check` asks, so that
a run's probe reads the rows past the cursor only; `on_schema_change: evolve`), copied by
this process. Each round times, each `replicator sync` its own process on a settled machine:

1. the full reload (`sync -f`): the baseline;
2. `ADD COLUMN region text DEFAULT 'eu'`, then a sync: the copy's ADD COLUMN gives every
   row 'eu' at once, and no row differs (target: 0.1x the reload, at most 1% of the rows
   written, counted as `n_tup_ins + n_tup_upd` of the copy);
3. `ADD COLUMN token uuid DEFAULT gen_random_uuid()`, then a sync: every value differs, so
   the sync reloads the table, which writes every row sooner than an UPDATE would (the
   issue's target was 0.7x for writing them in place);
4. `ALTER COLUMN customer_id TYPE bigint`, then a sync: the copy's ALTER rewrites it
   (target: at most the reload).

Between rounds the source goes back (the added columns dropped, customer_id an int again),
and the copy follows, untimed. Every copy is checked against the source after each step.

    .venv/bin/python bench/schema_evolution.py --rows 5000000 --repeat 2
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path

import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from full_load import build_source  # the 5M-row table every load benchmark uses
from one_table_run import same, settle, timed_sync, two_clusters

WRITTEN = """
SELECT n_tup_ins + n_tup_upd FROM pg_stat_all_tables WHERE relid = 'bench_orders'::regclass
"""
RELOAD = "full reload (sync -f)"
STEPS = (
    (
        "ADD COLUMN region text DEFAULT 'eu'",
        "ALTER TABLE bench_orders ADD COLUMN region text DEFAULT 'eu'",
    ),
    (
        "ADD COLUMN token uuid DEFAULT gen_random_uuid()",
        "ALTER TABLE bench_orders ADD COLUMN token uuid DEFAULT gen_random_uuid()",
    ),
    ("customer_id int -> bigint", "ALTER TABLE bench_orders ALTER COLUMN customer_id TYPE bigint"),
)
BACK = (
    "ALTER TABLE bench_orders DROP COLUMN region",
    "ALTER TABLE bench_orders DROP COLUMN token",
    "ALTER TABLE bench_orders ALTER COLUMN customer_id TYPE integer",
)


def written(dest: str) -> int:
    with psycopg.connect(dest, autocommit=True) as conn:
        conn.execute("SELECT pg_stat_force_next_flush()")
        return int(conn.execute(WRITTEN).fetchone()[0])


def run(source: str, statement: str) -> None:
    with psycopg.connect(source, autocommit=True) as conn:
        conn.execute(statement)
        conn.execute("VACUUM ANALYZE bench_orders")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=5_000_000)
    parser.add_argument("--repeat", type=int, default=2)
    args = parser.parse_args()
    with two_clusters("bench-evolution-") as (base, source, dest):
        print(f"building {args.rows:,} rows ...", flush=True)
        build_source(source, args.rows)
        with psycopg.connect(source, autocommit=True) as conn:  # as `check` asks of a cursor
            conn.execute("CREATE INDEX ON bench_orders (created_at)")
        project = base / "project"
        (project / "sync-state").mkdir(parents=True)
        table = {
            "name": "public.bench_orders",
            "replication_key": "created_at",
            "on_schema_change": "evolve",
        }
        config = {"tables": [table], "spark": {"min_rows": 10 * args.rows}}
        (project / "tables-config.json").write_text(json.dumps(config))
        env = {**os.environ, "REPLICATOR_SOURCE_URL": source, "REPLICATOR_DEST_URL": dest}
        timed_sync(project, env, "-q")
        seconds: dict[str, list[float]] = {RELOAD: [], **{label: [] for label, _ in STEPS}}
        rows_written: dict[str, list[int]] = {label: [] for label, _ in STEPS}
        how: dict[str, str] = {}
        for round_ in range(args.repeat):
            settle(source, dest)
            took, _ = timed_sync(project, env, "-q", "-f")
            same(source, dest)
            seconds[RELOAD].append(took)
            print(f"round {round_ + 1}: {RELOAD}: {took:.2f} s", flush=True)
            for label, statement in STEPS:
                run(source, statement)
                settle(source, dest)
                before = written(dest)
                took, said = timed_sync(project, env)
                evolved = "schema evolved: " in said
                if not evolved and "(cannot evolve: " not in said:
                    raise SystemExit(f"{label}: neither evolved nor reloaded:\n{said}")
                how[label] = "in place" if evolved else "reloaded (most rows differ)"
                same(source, dest)
                seconds[label].append(took)
                rows_written[label].append(written(dest) - before)
                print(
                    f"round {round_ + 1}: {label}: {took:.2f} s, {how[label]}, "
                    f"{rows_written[label][-1]:,} row(s) written",
                    flush=True,
                )
            for statement in BACK:  # untimed: the next round starts from the same table
                run(source, statement)
                timed_sync(project, env, "-q")
            same(source, dest)
        reload = statistics.median(seconds[RELOAD])
        print(f"\n| {args.rows:,} rows | how | rounds (s) | median (s) | / reload | rows written |")
        print("|---|---|---|---|---|---|")
        print(
            f"| {RELOAD} | reload | {', '.join(f'{s:.2f}' for s in seconds[RELOAD])} | "
            f"{reload:.2f} | 1.00x | all |"
        )
        for label, _ in STEPS:
            median = statistics.median(seconds[label])
            share = max(rows_written[label]) / args.rows
            print(
                f"| {label} | {how[label]} | {', '.join(f'{s:.2f}' for s in seconds[label])} | "
                f"{median:.2f} | "
                f"{median / reload:.2f}x | {max(rows_written[label]):,} ({share:.1%}) |"
            )


if __name__ == "__main__":
    main()
