"""How many statements one sync runs for each table it changes: `--tables` cursor tables
(default 20), each with `--changed` rows updated (default 10), synced once in this process
(no Spark), every statement counted on both sides as the executor logs it (`-v`'s `sql:`
lines: each statement run, and each COPY stream a task drives).

Printed: the statements of the whole run, per changed table, and the kinds that repeat
most (their first words), so that what a run does once per table stands out. The target:
at most 20 statements per changed cursor table in a run of 20.

    .venv/bin/python bench/statements.py --tables 20 --changed 10
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import psycopg
from psycopg import sql

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from replicator.postgres.pgcluster import PgCluster

SQL_LINE = re.compile(r" debug +sql: (.*)")
RECORD = re.compile(r"\d{4}-\d\d-\d\d[T ]\d\d:\d\d:\d\d")


def make_tables(url: str, count: int, rows: int) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("CREATE SCHEMA shop")
        for i in range(count):
            table = sql.Identifier("shop", f"t_{i:03d}")
            conn.execute(
                sql.SQL(
                    "CREATE TABLE {} (id int PRIMARY KEY, note text, "
                    "updated_at timestamptz NOT NULL DEFAULT clock_timestamp())"
                ).format(table)
            )
            conn.execute(sql.SQL("CREATE INDEX ON {} (updated_at)").format(table))
            conn.execute(
                sql.SQL(
                    "INSERT INTO {} (id, note) SELECT g, 'n' || g FROM generate_series(1, %s) g"
                ).format(table),
                (rows,),
            )
        conn.execute("ANALYZE")


def change(url: str, count: int, changed: int) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        for i in range(count):
            conn.execute(
                sql.SQL(
                    "UPDATE {} SET note = 'changed', updated_at = clock_timestamp() WHERE id <= %s"
                ).format(sql.Identifier("shop", f"t_{i:03d}")),
                (changed,),
            )


def sql_lines(log: str) -> list[str]:
    """Each statement the log shows, its continuation lines (a multi-line statement's)
    joined to it: a line that starts no log record continues the one before."""
    statements: list[str] = []
    inside = False
    for line in log.splitlines():
        if m := SQL_LINE.search(line):
            statements.append(m.group(1))
            inside = True
        elif RECORD.match(line):
            inside = False
        elif inside:
            statements[-1] += " " + line
    return [" ".join(s.split()) for s in statements]


def run(folder: Path, env: dict[str, str], *args: str) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "replicator", *args, "--project-dir", str(folder)],
        env=env,
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        raise SystemExit(f"{args} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return done.stderr


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tables", type=int, default=20)
    parser.add_argument("--changed", type=int, default=10)
    parser.add_argument("--rows", type=int, default=1000)
    parser.add_argument("--top", type=int, default=15)
    parser.add_argument("--dump", help="write every statement of the run to this file")
    args = parser.parse_args()
    base = Path(tempfile.mkdtemp(prefix="replicator-statements-"))
    clusters = [PgCluster(base / "source").start(), PgCluster(base / "dest").start()]
    try:
        source, dest = clusters[0].url(), clusters[1].url()
        make_tables(source, args.tables, args.rows)
        folder = base / "project"
        (folder / "sync-state").mkdir(parents=True)
        config = {"tables": [{"name": "shop.*", "replication_key": "updated_at"}]}
        (folder / "tables-config.json").write_text(json.dumps(config))
        env = {
            **os.environ,
            "REPLICATOR_SOURCE_URL": source,
            "REPLICATOR_DEST_URL": dest,
            "REPLICATOR_SPARK_MIN_ROWS": "1000000000",
            "REPLICATOR_WARM": "off",
        }
        run(folder, env, "sync", "-q")
        change(source, args.tables, args.changed)
        log = run(folder, env, "sync", "-v")
        statements = sql_lines(log)
        if args.dump:
            Path(args.dump).write_text("\n".join(statements) + "\n")
        kinds = collections.Counter(" ".join(s.split()[:3]) for s in statements)
        print(
            f"{len(statements)} statements for {args.tables} changed tables: "
            f"{len(statements) / args.tables:.1f} per table"
        )
        for kind, n in kinds.most_common(args.top):
            print(f"{n:5d}  {kind}")
    finally:
        for cluster in clusters:
            cluster.destroy()
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
