"""What an analyst's indexes cost a full reload: the same reload, with and without them.

On two throwaway clusters, the N-row table of bench/full_load.py (bigint key, timestamptz,
int, text, numeric, jsonb; about 350 bytes a row) is loaded once as a `full-refresh` table.
Then rounds alternate, each one `replicator sync` run as its own process (as cron runs it)
on a settled machine (both clusters checkpointed):

1. the reload of a copy with no index but its key;
2. the reload of the same copy after an analyst made two indexes on it (`customer_id`, and
   `created_at`), which the reload builds again on the new table before its swap.

Printed: each round's seconds, the medians, and the ratio of (2) to (1) (target: at most
1.3x). Every copy is checked against the source (row count and an md5 of the rows), and the
indexes are checked to be there after each reload of (2).

    .venv/bin/python bench/copy_objects.py --rows 5000000 --repeat 2
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

INDEXES = (
    "CREATE INDEX orders_customer ON public.bench_orders (customer_id)",
    "CREATE INDEX orders_created ON public.bench_orders (created_at)",
)


def indexes_of(dest: str) -> list[str]:
    with psycopg.connect(dest) as conn:
        rows = conn.execute(
            "SELECT indexname FROM pg_indexes WHERE tablename = 'bench_orders' ORDER BY 1"
        ).fetchall()
    return [row[0] for row in rows]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=5_000_000)
    parser.add_argument("--repeat", type=int, default=2)
    args = parser.parse_args()
    with two_clusters("bench-copy-objects-") as (base, source, dest):
        print(f"building {args.rows:,} rows ...", flush=True)
        build_source(source, args.rows)
        project = base / "project"
        (project / "sync-state").mkdir(parents=True)
        # copied by this process (as a cron run chooses for this table here): no JVM's
        # start in the figures
        config = {
            "tables": [{"name": "public.bench_orders", "mode": "full-refresh"}],
            "spark": {"min_rows": 10 * args.rows},
        }
        (project / "tables-config.json").write_text(json.dumps(config))
        env = {**os.environ, "REPLICATOR_SOURCE_URL": source, "REPLICATOR_DEST_URL": dest}
        timed_sync(project, env, "-q")  # the first load: both rows below are reloads of a copy
        timings: dict[str, list[float]] = {"no index": [], "two indexes": []}
        for round_ in range(args.repeat):
            for label in timings:
                with psycopg.connect(dest, autocommit=True) as conn:
                    for statement in INDEXES:
                        name = statement.split()[2]
                        conn.execute(f"DROP INDEX IF EXISTS public.{name}")
                        if label == "two indexes":
                            conn.execute(statement)
                settle(source, dest)
                seconds, said = timed_sync(project, env, "-q", "-f")
                if "left out" in said:
                    raise SystemExit(f"an index was left out:\n{said}")
                same(source, dest)
                if label == "two indexes":
                    kept = ["bench_orders_pkey", "orders_created", "orders_customer"]
                    assert indexes_of(dest) == kept, indexes_of(dest)
                timings[label].append(seconds)
                print(f"round {round_ + 1}: {label}: {seconds:.2f} s", flush=True)
        plain, indexed = (statistics.median(timings[k]) for k in timings)
        print(f"\n| reload of {args.rows:,} rows | median (s) | ratio |")
        print("|---|---|---|")
        print(f"| no index but the key | {plain:.2f} | 1.00x |")
        print(f"| two analysts' indexes, rebuilt | {indexed:.2f} | {indexed / plain:.2f}x |")


if __name__ == "__main__":
    main()
