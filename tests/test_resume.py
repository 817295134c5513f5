"""Resumable full loads: a load killed part-way keeps its committed partitions, the next
run copies only the missing ones from a new snapshot and catches up from the first one's
cursor. With writers updating (rows move pages), inserting and deleting in the source while
it happens, the copy ends equal to the source.

Copies run in the replicator process (the kill at `task-before-commit@N` hits the run
itself, at its Nth partition); the Spark path commits the same markers.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time

import psycopg
import pytest
from dbcompare import assert_same_table, leftovers
from engines import IN_PROCESS
from psycopg import sql

from replicator.base.identifiers import TableName

ROWS = 30_000


@pytest.fixture
def table(source_conn, schema):
    source_conn.execute(
        sql.SQL(
            "CREATE TABLE {} (id bigint PRIMARY KEY, v text, n int NOT NULL DEFAULT 0, "
            "updated_at timestamptz NOT NULL DEFAULT clock_timestamp())"
        ).format(sql.Identifier(schema, "t"))
    )
    source_conn.execute(
        sql.SQL(
            "INSERT INTO {} (id, v) SELECT g, md5(g::text) FROM generate_series(1, %s) g"
        ).format(sql.Identifier(schema, "t")),
        (ROWS,),
    )
    source_conn.execute(sql.SQL("ANALYZE {}").format(sql.Identifier(schema, "t")))
    return schema


def _configure(db_project, schema: str, **table) -> None:
    db_project.write_config(
        {
            "tables": [
                {
                    "name": f"{schema}.t",
                    "replication_key": "updated_at",
                    "partitions": 10,
                    "deletes": "delete",
                    **table,
                }
            ]
        }
    )


class _Writers:
    """Updates (which move rows to other pages), inserts and deletes, committed one small
    transaction at a time, until stopped."""

    def __init__(self, url: str, schema: str) -> None:
        self.url, self.table = url, sql.Identifier(schema, "t")
        self.stop_event, self.error = threading.Event(), None
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            with psycopg.connect(self.url, autocommit=True) as conn:
                next_id = ROWS + 1
                while not self.stop_event.is_set():
                    conn.execute(
                        sql.SQL(
                            "UPDATE {t} SET n = n + 1, v = repeat('u', 40), "
                            "updated_at = clock_timestamp() WHERE id IN "
                            "(SELECT (random() * %s)::bigint + 1 FROM generate_series(1, 20))"
                        ).format(t=self.table),
                        (ROWS,),
                    )
                    conn.execute(
                        sql.SQL("INSERT INTO {} (id, v) VALUES (%s, 'new'), (%s, 'new')").format(
                            self.table
                        ),
                        (next_id, next_id + 1),
                    )
                    conn.execute(
                        sql.SQL("DELETE FROM {} WHERE id = (random() * %s)::bigint + 1").format(
                            self.table
                        ),
                        (ROWS,),
                    )
                    next_id += 2
                    time.sleep(0.005)
        except BaseException as exc:  # reported by stop()
            self.error = exc

    def stop(self) -> None:
        self.stop_event.set()
        self.thread.join(30)
        assert self.error is None, self.error


def _killed(db_project, point: str, *args: str):
    """`sync [args]` in-process copies, SIGKILLed at the failpoint; its CompletedProcess."""
    run = db_project.run_process("sync", *args, env={**IN_PROCESS, "REPLICATOR_FAILPOINT": point})
    assert run.returncode == -9, f"the run did not reach {point}: {run.stderr}"
    return run


def _resumable(db_project) -> dict | None:
    listed = db_project.run("status", "--json", env=IN_PROCESS)
    return json.loads(listed.stdout)[0]["resumable"]


@pytest.mark.parametrize(
    ("point", "loaded", "writers_during_resume"),
    [
        ("task-before-commit@1", 0, False),
        ("task-before-commit@5", 4, False),
        ("mid-extract@8", 7, True),
        ("task-before-commit@10", 9, False),
        ("after-load-before-swap", 10, False),
        ("before-swap-commit", 10, False),  # its key built on the side table already
    ],
)
def test_a_killed_load_resumes_and_catches_up_under_writers(
    db_project, table, source_conn, dest_conn, pg_servers, point, loaded, writers_during_resume
):
    _configure(db_project, table)
    writers = _Writers(pg_servers.source_url, table)
    try:
        _killed(db_project, point)
        assert _resumable(db_project) == {"loaded": loaded, "partitions": 10}
        time.sleep(0.5)  # more changes between the two snapshots
        if not writers_during_resume:
            writers.stop()
        resumed = db_project.run("sync", env=IN_PROCESS)
    finally:
        writers.stop()
    assert resumed.exit_code == 0, resumed.stderr
    assert f"resuming the load: {loaded} of 10 partitions loaded" in resumed.stderr
    assert "caught up after the resumed load: " in resumed.stderr
    if writers_during_resume:  # the catch-up's snapshot is already behind the writers
        assert db_project.run("sync", env=IN_PROCESS).exit_code == 0
    assert assert_same_table(source_conn, dest_conn, table, "t") > ROWS
    assert leftovers(dest_conn, [TableName(table, "t")]) == []
    state = json.loads(db_project.run("state", "show", f"{table}.t").stdout)[f"{table}.t"]
    assert state["last_run"]["status"] == "success"


def test_a_resumed_load_killed_again_resumes_again(db_project, table, source_conn, dest_conn):
    _configure(db_project, table)
    _killed(db_project, "task-before-commit@3")
    second = _killed(db_project, "task-before-commit@4")
    assert "resuming the load: 2 of 10 partitions loaded, copying 8" in second.stderr
    assert _resumable(db_project) == {"loaded": 5, "partitions": 10}
    third = db_project.run("sync", env=IN_PROCESS)
    assert third.exit_code == 0, third.stderr
    assert "resuming the load: 5 of 10 partitions loaded, copying 5" in third.stderr
    assert assert_same_table(source_conn, dest_conn, table, "t") == ROWS
    assert leftovers(dest_conn, [TableName(table, "t")]) == []


@pytest.mark.parametrize("why", ["full-refresh", "shape", "age", "replication-key"])
def test_a_resume_that_cannot_be_trusted_starts_over(
    db_project, table, source_conn, dest_conn, why
):
    _configure(db_project, table)
    _killed(db_project, "task-before-commit@6")
    args, expected = ["sync"], ""
    if why == "full-refresh":
        args, expected = ["sync", "-f"], "sync --full-refresh was given"
    elif why == "shape":
        source_conn.execute(
            sql.SQL("ALTER TABLE {} ADD COLUMN region text DEFAULT 'eu'").format(
                sql.Identifier(table, "t")
            )
        )
        expected = "the source or its model changed shape since"
    elif why == "age":
        dest_conn.execute(
            "UPDATE _replicator.resumable_loads SET started_at = now() - interval '8 days'"
        )
        expected = "its first part is 8 days old (more than 7)"
    else:  # its catch-up would start from a cursor on another column
        _configure(db_project, table, replication_key="id")
        expected = "the source or its model changed shape since"
    again = db_project.run(*args, env=IN_PROCESS)
    assert again.exit_code == 0, again.stderr
    assert (
        f"not resuming the unfinished load (5 of 10 partitions loaded): {expected}; "
        "starting over" in again.stderr
    )
    assert "resuming the load" not in again.stderr
    assert assert_same_table(source_conn, dest_conn, table, "t") == ROWS
    assert leftovers(dest_conn, [TableName(table, "t")]) == []


def test_a_killed_full_refresh_is_dropped_when_the_table_goes_on_incrementally(
    db_project, table, source_conn, dest_conn
):
    _configure(db_project, table)
    assert db_project.run("sync", env=IN_PROCESS).exit_code == 0
    _killed(db_project, "task-before-commit@4", "-f")
    source_conn.execute(
        sql.SQL("UPDATE {} SET v = 'x', updated_at = clock_timestamp() WHERE id < 50").format(
            sql.Identifier(table, "t")
        )
    )
    again = db_project.run("sync", env=IN_PROCESS)
    assert again.exit_code == 0, again.stderr
    assert "dropped an unfinished reload (3 of 10 partitions loaded)" in again.stderr
    assert "t: incremental" in again.stderr
    assert assert_same_table(source_conn, dest_conn, table, "t") == ROWS
    assert leftovers(dest_conn, [TableName(table, "t")]) == []


# Partition 5 (ids 15001-18000) stops at id 16000 while a `pause` row exists; only the copy
# tasks' sessions stop (the run's own reads of the model, for the first cursor, go on).
PAUSING_MODEL = """
SELECT t.id, t.v, t.n, t.updated_at FROM {{ source }} AS t
WHERE t.id <> 16000 OR current_setting('application_name') <> 'replicator-task'
   OR NOT EXISTS (SELECT FROM SCHEMA.pause) OR pg_sleep(120) IS NOT NULL
"""


@pytest.mark.parametrize("where", ["in-process", "spark"])
def test_an_interrupted_load_keeps_its_partitions_for_the_next_run(
    db_project, table, source_conn, dest_conn, where
):
    """Ctrl-C (or SIGTERM) in the middle of a long load: the partitions already in stay, and
    the tasks still stopping print nothing (on Spark, they fail as their snapshot goes)."""
    source_conn.execute(sql.SQL("CREATE TABLE {} ()").format(sql.Identifier(table, "pause")))
    source_conn.execute(
        sql.SQL("INSERT INTO {} DEFAULT VALUES").format(sql.Identifier(table, "pause"))
    )
    db_project.write(f"models/{table}/t.sql", PAUSING_MODEL.replace("SCHEMA", table))
    _configure(db_project, table)
    env = IN_PROCESS if where == "in-process" else {"REPLICATOR_SPARK_MIN_ROWS": "0"}
    run = subprocess.Popen(
        [sys.executable, "-m", "replicator", "sync", "--project-dir", str(db_project.path)],
        env={**os.environ, **db_project.env, **env},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        text=True,
    )
    try:
        deadline = time.monotonic() + 120
        while not source_conn.execute(
            "SELECT FROM pg_stat_activity WHERE wait_event = 'PgSleep' AND query LIKE %s",
            (f"%{table}%",),
        ).fetchall():
            assert time.monotonic() < deadline, "the load never reached its pause"
            time.sleep(0.1)
        time.sleep(1)  # on Spark, the other task goes on meanwhile
        run.send_signal(signal.SIGTERM)
        _, stderr = run.communicate(timeout=60)
    finally:
        run.kill()
    assert run.returncode == 143, stderr
    kept = re.search(r"partitions loaded so far \((\d+) of 10\) are kept: the next sync", stderr)
    assert kept and int(kept[1]) >= 5, stderr
    for noise in ("Traceback", "ERROR", "Exception"):
        assert noise not in stderr, stderr
    source_conn.execute(sql.SQL("DELETE FROM {}").format(sql.Identifier(table, "pause")))
    loaded = _resumable(db_project)
    assert loaded is not None and loaded["loaded"] >= int(kept[1])
    resumed = db_project.run("sync", env=env)
    assert resumed.exit_code == 0, resumed.stderr
    assert f"resuming the load: {loaded['loaded']} of 10 partitions loaded" in resumed.stderr
    assert assert_same_table(source_conn, dest_conn, table, "t") == ROWS
    assert leftovers(dest_conn, [TableName(table, "t")]) == []


def test_a_killed_start_over_never_resumes_the_load_it_dropped(
    db_project, table, source_conn, dest_conn
):
    """`sync -f` empties the side table of the unfinished load it does not resume: killed
    right after, the next run must not take the old partitions for loaded."""
    _configure(db_project, table)
    _killed(db_project, "task-before-commit@6")
    _killed(db_project, "after-snapshot-export", "-f")
    assert _resumable(db_project) is None
    last = db_project.run("sync", env=IN_PROCESS)
    assert last.exit_code == 0, last.stderr
    assert "resuming the load" not in last.stderr
    assert assert_same_table(source_conn, dest_conn, table, "t") == ROWS
    assert leftovers(dest_conn, [TableName(table, "t")]) == []


def test_an_append_table_read_by_pages_starts_over(db_project, table, source_conn, dest_conn):
    """Its updates keep their key, so a row moved to a page already copied could be lost."""
    _configure(db_project, table, mode="incremental-append", deletes="ignore")
    _killed(db_project, "task-before-commit@4")
    assert _resumable(db_project) is None
    again = db_project.run("sync", env=IN_PROCESS)
    assert again.exit_code == 0, again.stderr
    assert "resuming the load" not in again.stderr
    assert assert_same_table(source_conn, dest_conn, table, "t") == ROWS


def test_compile_shows_the_resumed_load(db_project, table):
    _configure(db_project, table)
    _killed(db_project, "task-before-commit@5")
    compiled = db_project.run("compile", "--json", env=IN_PROCESS)
    assert compiled.exit_code == 0, compiled.output
    (shown,) = json.loads(compiled.stdout)
    assert "resumes an unfinished load: 4 of 10 partitions loaded" in " ".join(shown["notes"])
    script = shown["script"]["full_reload"]
    assert len({s["task"] for s in script if "task" in s}) == 6  # the missing partitions only
    assert not any(s["sql"].startswith("CREATE TABLE") and "new_" in s["sql"] for s in script)


def test_a_load_that_fails_after_its_copy_starts_over_once_the_source_is_fixed(
    db_project, schema, source_conn, dest_conn
):
    """A `primary_key` chosen over a nullable column, and a row with NULL there: every
    partition is copied, then the key's build fails, with the fix. Such a load is not kept
    (a resumed one would copy nothing and fail the same way on the rows it kept): once the
    row is fixed in the source, the next sync loads the table."""
    events = sql.Identifier(schema, "events")
    source_conn.execute(
        sql.SQL(
            "CREATE TABLE {} (id bigint NOT NULL, k int, "
            "updated_at timestamptz NOT NULL DEFAULT clock_timestamp())"
        ).format(events)
    )
    source_conn.execute(
        sql.SQL("INSERT INTO {} (id, k) SELECT g, g FROM generate_series(1, 5000) g").format(events)
    )
    source_conn.execute(sql.SQL("UPDATE {} SET k = NULL WHERE id = 4000").format(events))
    db_project.write_config(
        {
            "tables": [
                {
                    "name": f"{schema}.events",
                    "replication_key": "updated_at",
                    "primary_key": ["k"],
                    "partitions": 4,
                }
            ]
        }
    )
    failed = db_project.run("sync", env=IN_PROCESS)
    assert failed.exit_code == 1
    assert (
        "the source has rows with NULL in the primary key (k), which a primary key cannot hold"
        in failed.stderr
    ), failed.stderr
    assert "new_" not in failed.stderr, "the message names the side table"
    assert _resumable(db_project) is None
    source_conn.execute(sql.SQL("UPDATE {} SET k = id WHERE k IS NULL").format(events))
    fixed = db_project.run("sync", env=IN_PROCESS)
    assert fixed.exit_code == 0, fixed.stderr
    assert "resuming" not in fixed.stderr
    rows = sql.SQL("SELECT id, k, updated_at FROM {} ORDER BY id").format(events)
    copied = dest_conn.execute(rows).fetchall()  # k is NOT NULL there: the key
    assert copied == source_conn.execute(rows).fetchall() and len(copied) == 5000
    assert leftovers(dest_conn, [TableName(schema, "events")]) == []
