"""Log capture benchmark: `replicator sync` applying 1M logged changes against PostgreSQL's own
logical replication applying the same changes, on the same clusters, in one run.

1. A source table of --rows rows, copied twice into the destination cluster: by replicator
   (`mode: "cdc"`, database `postgres`) and by a subscription (database `subscriber`), which
   is then disabled.
2. --changes changes in the source: 60% updates, 20% inserts, 20% deletes, in transactions
   of 1 to 10,000 rows (log-uniform sizes).
3. Timed: `replicator sync` (the drain, in its own process: wall time and peak RSS), then the
   subscription enabled until its slot has confirmed the source's flushed position (what
   PostgreSQL itself needs to apply them: the limit for PG->PG). Both copies are then compared
   with the source (md5 of every row).
4. `sync --follow --interval 1` under a steady --rate changes/s for --seconds: the lag of each
   change (its arrival in the destination minus its commit) at p50 / p95 / max.

    .venv/bin/python bench/cdc.py --rows 1000000 --changes 1000000
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psycopg
from procwatch import run_measured

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from replicator.postgres.pgcluster import PgCluster

DDL = (
    "CREATE TABLE bench_orders (id bigint PRIMARY KEY, customer_id int NOT NULL, note text, "
    "amount numeric(12,2), updated_at timestamptz NOT NULL)"
)
FILL = (
    "INSERT INTO bench_orders SELECT g, g %% 100000, 'order note ' || md5(g::text), "
    "(g %% 100000) / 100.0, now() FROM generate_series(%s::bigint, %s::bigint) g"
)
LAG_DDL = "CREATE TABLE bench_lag (id bigint PRIMARY KEY, written_at timestamptz NOT NULL)"
HASH = "SELECT md5(string_agg(md5(t::text), '' ORDER BY id)) FROM bench_orders t"


def transaction_sizes(total: int, seed: int = 7, largest: int = 10_000) -> list[int]:
    """Sizes from 1 to `largest` (log-uniform) adding up to `total`; `largest` 0: one."""
    if largest == 0:
        return [total]
    rng, sizes, left = random.Random(seed), [], total
    while left > 0:
        size = min(left, max(1, int(math.exp(rng.uniform(0, math.log(largest))))))
        sizes.append(size)
        left -= size
    return sizes


def make_changes(
    url: str, rows: int, total: int, largest: int, where: dict[str, int] | None = None
) -> dict[str, int]:
    """Updates in the middle of the key range, deletes from the low end, inserts at the top.
    `where`: the positions a previous call left (low, top, middle), for a next round; they
    are updated."""
    counts = {"update": 0, "insert": 0, "delete": 0}
    where = where if where is not None else {}
    low, top, middle = where.get("low", 1), where.get("top", rows + 1), where.get("middle", 0)
    middle = middle or low + rows // 5
    with psycopg.connect(url, autocommit=True) as conn:
        for size in transaction_sizes(total, largest=largest):
            inserts, deletes = size // 5, size // 5
            updates = size - inserts - deletes
            with conn.transaction():
                if updates:
                    conn.execute(
                        "UPDATE bench_orders SET amount = amount + 1, updated_at = now() "
                        "WHERE id >= %s AND id < %s",
                        (middle, middle + updates),
                    )
                    middle = middle + updates if middle + updates < rows else rows // 5 + 1
                if deletes:
                    conn.execute(
                        "DELETE FROM bench_orders WHERE id >= %s AND id < %s", (low, low + deletes)
                    )
                    low += deletes
                if inserts:
                    conn.execute(FILL, (top, top + inserts - 1))
                    top += inserts
            counts["update"] += updates
            counts["insert"] += inserts
            counts["delete"] += deletes
        conn.execute("SET synchronous_commit = on")
        conn.execute("CREATE TABLE IF NOT EXISTS bench_flush (n int)")  # flushes the WAL
    where.update(low=low, top=top, middle=middle)
    return counts


def wait_for_subscription(source_url: str, slot: str, target: str) -> None:
    with psycopg.connect(source_url, autocommit=True) as conn:
        while True:
            (done,) = conn.execute(
                "SELECT confirmed_flush_lsn >= %s::pg_lsn FROM pg_replication_slots "
                "WHERE slot_name = %s",
                (target, slot),
            ).fetchone()
            if done:
                return
            time.sleep(0.02)


def same(url_a: str, url_b: str) -> bool:
    hashes = []
    for url in (url_a, url_b):
        with psycopg.connect(url) as conn:
            hashes.append(conn.execute(HASH).fetchone()[0])
    return hashes[0] == hashes[1]


def follow_lag(
    source: PgCluster, dest: PgCluster, cli: str, where: str, env: dict, rate: int, seconds: int
) -> list[float]:
    """Lags (seconds) of changes written at `rate` per second while `--follow` runs."""
    follower = subprocess.Popen(
        shlex.split(f"{cli} sync --follow --interval 1 -q {where}"),
        env=env,
        stdin=subprocess.DEVNULL,
    )
    lags: list[float] = []
    stop = threading.Event()

    def write() -> None:
        with psycopg.connect(source.url(), autocommit=True) as conn:
            conn.execute("SET synchronous_commit = on")
            n, started = 0, time.monotonic()
            while not stop.is_set():
                batch = max(rate // 10, 1)  # ten transactions a second
                conn.execute(
                    "INSERT INTO bench_lag SELECT g, clock_timestamp() "
                    "FROM generate_series(%s::bigint, %s::bigint) g",
                    (n + 1, n + batch),
                )
                n += batch
                time.sleep(max(0.0, started + n / rate - time.monotonic()))

    try:
        time.sleep(3)  # the follower's first run
        writer = threading.Thread(target=write)
        writer.start()
        seen = 0
        deadline = time.monotonic() + seconds
        with psycopg.connect(dest.url(), autocommit=True) as conn:
            while time.monotonic() < deadline:
                rows = conn.execute(
                    "SELECT id, extract(epoch FROM clock_timestamp() - written_at) "
                    "FROM bench_lag WHERE id > %s",
                    (seen,),
                ).fetchall()
                for row_id, lag in rows:
                    lags.append(float(lag))
                    seen = max(seen, row_id)
                time.sleep(0.05)
        stop.set()
        writer.join()
    finally:
        follower.send_signal(signal.SIGTERM)
        follower.wait(timeout=120)
    return lags


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--changes", type=int, default=1_000_000)
    parser.add_argument("--rate", type=int, default=1_000)
    parser.add_argument("--seconds", type=int, default=30)
    parser.add_argument(
        "--one-transaction",
        action="store_true",
        help="make all the changes in a single transaction (memory stays bounded?)",
    )
    args = parser.parse_args()
    base = Path(tempfile.mkdtemp(prefix="replicator-bench-cdc-"))
    source, dest = PgCluster(base / "source", logical=True), PgCluster(base / "dest")
    try:
        source.start()
        dest.start()
        with psycopg.connect(source.url(), autocommit=True) as conn:
            conn.execute(DDL)
            conn.execute(LAG_DDL)
            for low in range(1, args.rows + 1, 1_000_000):
                conn.execute(FILL, (low, min(args.rows, low + 999_999)))
            conn.execute("CREATE PUBLICATION bench_sub FOR TABLE bench_orders")
        with psycopg.connect(dest.url(), autocommit=True) as conn:
            conn.execute("CREATE DATABASE subscriber")
        with psycopg.connect(dest.url("subscriber"), autocommit=True) as conn:
            conn.execute(DDL)
            conn.execute(
                "CREATE SUBSCRIPTION bench_sub CONNECTION %s PUBLICATION bench_sub "
                "WITH (slot_name = 'bench_sub')".replace("%s", "'" + source.url() + "'")
            )
            while conn.execute(
                "SELECT count(*) FROM pg_subscription_rel WHERE srsubstate <> 'r'"
            ).fetchone()[0]:
                time.sleep(0.2)
            conn.execute("ALTER SUBSCRIPTION bench_sub DISABLE")
        project = base / "project"
        (project / "sync-state").mkdir(parents=True)
        (project / "tables-config.json").write_text(
            json.dumps(
                {
                    "tables": [
                        {"name": "public.bench_orders", "mode": "cdc"},
                        {"name": "public.bench_lag", "mode": "cdc"},
                    ]
                }
            )
        )
        env = {
            **os.environ,
            "REPLICATOR_SOURCE_URL": source.url(),
            "REPLICATOR_DEST_URL": dest.url(),
        }
        cli = f"{shlex.quote(sys.executable)} -m replicator"
        where = f"--project-dir {shlex.quote(str(project))}"
        first = run_measured(f"{cli} sync -q {where}", env)
        print(f"initial loads: replicator {first.seconds:.1f} s; subscription copied", flush=True)
        started = time.monotonic()
        largest = 0 if args.one_transaction else 10_000
        counts = make_changes(source.url(), args.rows, args.changes, largest)
        with psycopg.connect(source.url(), autocommit=True) as conn:
            (target,) = conn.execute("SELECT pg_current_wal_flush_lsn()::text").fetchone()
        print(
            f"made {sum(counts.values()):,} changes ({counts}) in "
            f"{len(transaction_sizes(args.changes, largest=largest))} transaction(s) in "
            f"{time.monotonic() - started:.1f} s",
            flush=True,
        )
        flags = os.environ.get("BENCH_CDC_FLAGS", "-q")  # "-v 2>file": the drain's timings
        ours = run_measured(f"{cli} sync {flags} {where}", env)
        if ours.returncode != 0:
            raise SystemExit(f"replicator sync: exit {ours.returncode}")
        with psycopg.connect(dest.url("subscriber"), autocommit=True) as conn:
            began = time.monotonic()
            conn.execute("ALTER SUBSCRIPTION bench_sub ENABLE")
            wait_for_subscription(source.url(), "bench_sub", target)
            theirs = time.monotonic() - began
        equal = same(source.url(), dest.url()), same(source.url(), dest.url("subscriber"))
        print(f"\n{args.changes:,} changes on a {args.rows:,}-row table, {os.cpu_count()} cores")
        print("| path | wall | peak RSS | / subscription |")
        print("|---|---|---|---|")
        print(
            f"| PostgreSQL subscription (enable -> caught up) | {theirs:.2f} s | (server) | 1.00x |"
        )
        print(
            f"| replicator sync (cdc drain) | {ours.seconds:.2f} s | {ours.peak_rss_mb:,.0f} MB | "
            f"{ours.seconds / theirs:.2f}x |"
        )
        print(f"copies equal to the source (replicator, subscription): {equal}")
        with psycopg.connect(dest.url("subscriber"), autocommit=True) as conn:
            conn.execute("ALTER SUBSCRIPTION bench_sub DISABLE")
            conn.execute("ALTER SUBSCRIPTION bench_sub SET (slot_name = NONE)")
            conn.execute("DROP SUBSCRIPTION bench_sub")
        with psycopg.connect(source.url(), autocommit=True) as conn:
            conn.execute("SELECT pg_drop_replication_slot('bench_sub')")
        lags = follow_lag(source, dest, cli, where, env, args.rate, args.seconds)
        if lags:
            lags.sort()
            p95 = lags[min(len(lags) - 1, int(len(lags) * 0.95))]
            print(
                f"\nsync --follow --interval 1 under {args.rate:,} changes/s for {args.seconds} s: "
                f"{len(lags):,} changes, lag p50 {statistics.median(lags):.2f} s, "
                f"p95 {p95:.2f} s, max {lags[-1]:.2f} s"
            )
    finally:
        source.destroy()
        dest.destroy()
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
