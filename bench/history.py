"""History tables' cost: a `cdc` drain of --changes logged changes into a copy that keeps
history (`"history": true`) against the same drain into a copy that does not, in one run,
and the storage a version takes against a row of the copy.

1. A source table of --rows rows (bench/cdc.py's), copied by two projects into one
   destination: `public.bench_orders` without history, `hist.bench_orders` with it. Each
   project has its own slot, so both read the same changes.
2. Each round: --changes changes (bench/cdc.py's mix: 60% updates, 20% inserts, 20%
   deletes, transactions of 1 to 10,000 rows), then both drains timed, one after the other
   (their order alternates by round), each in its own process (wall time, peak RSS).
3. Both copies and the history's current versions are compared with the source (md5 of
   every row); the history has one version per key and transaction (counted).
4. Storage: the history table's size (heap, indexes, TOAST) per version against the copy's
   per row, as the drains left them (dead row versions included, which VACUUM lets later
   writes reuse) and compacted by VACUUM FULL.
5. The floor: the least any drain that keeps `_valid_to` and `_is_current` on the versions
   writes, timed alone (`bare_writes`), and the ratio a drain would have if it wrote only
   that on top of the drain without history.

    .venv/bin/python bench/history.py --rows 1000000 --changes 1000000 --repeat 2
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
import time
from pathlib import Path

import psycopg
from cdc import DDL, FILL, HASH, make_changes, transaction_sizes
from procwatch import run_measured

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from replicator.postgres.pgcluster import PgCluster

CURRENT_HASH = (
    "SELECT md5(string_agg(md5(ROW(id, customer_id, note, amount, updated_at)::text), '' "
    "ORDER BY id)) FROM hist.bench_orders_history WHERE _is_current"
)
SIZE = "SELECT pg_total_relation_size(%s::regclass), (SELECT count(*) FROM {table})"


def project(base: Path, name: str, destination: str, history: bool) -> str:
    folder = base / name
    (folder / "sync-state").mkdir(parents=True)
    entry = {"name": "public.bench_orders", "mode": "cdc", "destination": destination}
    if history:
        entry["history"] = True
    (folder / "tables-config.json").write_text(
        json.dumps({"tables": [entry], "cdc": {"slot": f"bench_{name}", "publication": name}})
    )
    return f"--project-dir {shlex.quote(str(folder))}"


def size_per_row(url: str, table: str) -> float:
    with psycopg.connect(url, autocommit=True) as conn:
        total, rows = conn.execute(SIZE.format(table=table), (table,)).fetchone()
    return total / max(rows, 1)


def bare_writes(url: str, versions: int) -> tuple[float, float]:
    """The least a history's drain writes, timed: `versions` current versions closed by key
    in one UPDATE, and as many new ones inserted in one INSERT (rolled back). A floor under
    any way of keeping `_valid_to` and `_is_current` on the versions themselves."""
    with psycopg.connect(url) as conn:
        conn.execute(
            "CREATE TEMP TABLE k AS SELECT id FROM hist.bench_orders_history WHERE _is_current "
            "ORDER BY id DESC LIMIT %s",
            (versions,),
        )
        conn.execute("ANALYZE k")
        started = time.monotonic()
        conn.execute(
            "UPDATE hist.bench_orders_history AS h SET _valid_to = now(), _is_current = false "
            "FROM k WHERE h.id = k.id AND h._is_current"
        )
        closed = time.monotonic() - started
        started = time.monotonic()
        conn.execute(
            "INSERT INTO hist.bench_orders_history SELECT c.*, now() + interval '1 second', "
            "NULL, true, 'update' FROM hist.bench_orders AS c JOIN k USING (id)"
        )
        opened = time.monotonic() - started
        conn.rollback()
    return closed, opened


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--changes", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=2)
    args = parser.parse_args()
    base = Path(tempfile.mkdtemp(prefix="replicator-bench-history-"))
    source, dest = PgCluster(base / "source", logical=True), PgCluster(base / "dest")
    try:
        source.start()
        dest.start()
        slow = os.environ.get("BENCH_SLOW_MS")  # the destination logs statements past it
        if slow:
            with psycopg.connect(dest.url(), autocommit=True) as conn:
                conn.execute(f"ALTER SYSTEM SET log_min_duration_statement = {int(slow)}")
                if os.environ.get("BENCH_EXPLAIN"):  # and the plans of those, as they ran
                    conn.execute("LOAD 'auto_explain'")
                    conn.execute("ALTER SYSTEM SET session_preload_libraries = 'auto_explain'")
                    conn.execute(f"ALTER SYSTEM SET auto_explain.log_min_duration = {int(slow)}")
                    conn.execute("ALTER SYSTEM SET auto_explain.log_analyze = on")
                conn.execute("SELECT pg_reload_conf()")
        with psycopg.connect(source.url(), autocommit=True) as conn:
            conn.execute(DDL)
            for low in range(1, args.rows + 1, 1_000_000):
                conn.execute(FILL, (low, min(args.rows, low + 999_999)))
        env = {
            **os.environ,
            "REPLICATOR_SOURCE_URL": source.url(),
            "REPLICATOR_DEST_URL": dest.url(),
        }
        cli = f"{shlex.quote(sys.executable)} -m replicator"
        plain = project(base, "plain", "public.bench_orders", False)
        kept = project(base, "kept", "hist.bench_orders", True)
        for where in (plain, kept):
            first = run_measured(f"{cli} sync -q {where}", env)
            if first.returncode != 0:
                raise SystemExit(f"the first load failed: exit {first.returncode}")
        loaded = size_per_row(dest.url(), "hist.bench_orders")  # a row of a fresh copy
        print(f"{args.rows:,} rows loaded twice; {os.cpu_count()} cores", flush=True)
        rows, positions = [], {}
        for round_no in range(1, args.repeat + 1):
            counts = make_changes(source.url(), args.rows, args.changes, 10_000, positions)
            transactions = len(transaction_sizes(args.changes, largest=10_000))
            order = [("without history", plain), ("with history", kept)]
            if round_no % 2 == 0:
                order.reverse()
            timed = {}
            for label, where in order:
                measured = run_measured(f"{cli} sync -q {where}", env)
                if measured.returncode != 0:
                    raise SystemExit(f"{label}: exit {measured.returncode}")
                timed[label] = measured
            without, with_ = timed["without history"], timed["with history"]
            rows.append((round_no, sum(counts.values()), transactions, without, with_))
            print(
                f"round {round_no}: {sum(counts.values()):,} changes in {transactions:,} "
                f"transactions: without history {without.seconds:.2f} s "
                f"({without.peak_rss_mb:,.0f} MB), with history {with_.seconds:.2f} s "
                f"({with_.peak_rss_mb:,.0f} MB): {with_.seconds / without.seconds:.2f}x",
                flush=True,
            )
        with psycopg.connect(source.url()) as conn:
            (truth,) = conn.execute(HASH).fetchone()
        with psycopg.connect(dest.url()) as conn:
            (plain_hash,) = conn.execute(HASH).fetchone()
            (kept_hash,) = conn.execute(
                HASH.replace("bench_orders", "hist.bench_orders")
            ).fetchone()
            (current_hash,) = conn.execute(CURRENT_HASH).fetchone()
            (versions, keys_twice) = conn.execute(
                "SELECT count(*), count(*) - count(DISTINCT (id, _valid_from)) "
                "FROM hist.bench_orders_history"
            ).fetchone()
        sizes = {
            "copy": size_per_row(dest.url(), "hist.bench_orders"),
            "history": size_per_row(dest.url(), "hist.bench_orders_history"),
        }
        with psycopg.connect(dest.url(), autocommit=True) as conn:
            conn.execute("VACUUM FULL hist.bench_orders, hist.bench_orders_history")
        vacuumed = {
            "copy": size_per_row(dest.url(), "hist.bench_orders"),
            "history": size_per_row(dest.url(), "hist.bench_orders_history"),
        }
        floor = bare_writes(dest.url(), int(args.changes * 0.8))  # after the sizes: it bloats
        print(f"\n{args.changes:,} changes a round on a {args.rows:,}-row table")
        print("| round | changes | transactions | without history | with history | ratio |")
        print("|---|---|---|---|---|---|")
        for round_no, changes, transactions, without, with_ in rows:
            print(
                f"| {round_no} | {changes:,} | {transactions:,} | {without.seconds:.2f} s, "
                f"{without.peak_rss_mb:,.0f} MB | {with_.seconds:.2f} s, "
                f"{with_.peak_rss_mb:,.0f} MB | {with_.seconds / without.seconds:.2f}x |"
            )
        print(
            f"\ncopies equal to the source: without history {plain_hash == truth}, with history "
            f"{kept_hash == truth}, history's current versions {current_hash == truth}; "
            f"{versions:,} versions, {keys_twice} (key, _valid_from) twice"
        )
        without = statistics.median(r[3].seconds for r in rows)
        print(
            f"the bare writes of {int(args.changes * 0.8):,} versions (one UPDATE that closes "
            f"the current ones by key, one INSERT of the new ones, rolled back): "
            f"{floor[0]:.2f} s + {floor[1]:.2f} s; a drain that did only those on top: "
            f"{(without + sum(floor)) / without:.2f}x the drain without history at best"
        )
        print(
            f"storage per row: copy {sizes['copy']:.0f} B, history {sizes['history']:.0f} B "
            f"({sizes['history'] / sizes['copy']:.2f}x); compacted (VACUUM FULL) "
            f"{vacuumed['copy']:.0f} B "
            f"and {vacuumed['history']:.0f} B ({vacuumed['history'] / vacuumed['copy']:.2f}x); "
            f"a row of the copy as its load left it {loaded:.0f} B: a version "
            f"{vacuumed['history'] / loaded:.2f}x that"
        )
        if slow:
            print(dest.logfile.read_text()[-int(os.environ.get("BENCH_LOG_CHARS", 20000)) :])
    finally:
        source.destroy()
        dest.destroy()
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
