"""Two copies of one project syncing one destination: one table, one replicator at a time."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest
from dbcompare import assert_same_table
from psycopg import sql

from replicator.base.identifiers import TableName
from replicator.postgres.table_lock import lock_key

pytestmark = pytest.mark.spark


@pytest.fixture
def two_tables(source_conn, schema):
    for name in ("a", "b"):
        source_conn.execute(
            sql.SQL(
                "CREATE TABLE {} (id int PRIMARY KEY, v text, "
                "updated_at timestamptz NOT NULL DEFAULT clock_timestamp())"
            ).format(sql.Identifier(schema, name))
        )
        source_conn.execute(
            sql.SQL("INSERT INTO {} (id, v) SELECT g, 'v' FROM generate_series(1, 5000) g").format(
                sql.Identifier(schema, name)
            )
        )
    return schema


def test_a_table_held_by_another_host_is_refused_and_the_others_sync(
    db_project, two_tables, dest_conn, source_conn
):
    schema = two_tables
    db_project.configure(schema, "a", "b", replication_key="updated_at")
    with dest_conn.transaction():  # "the other host", mid-sync of table a
        dest_conn.execute(
            "SELECT pg_advisory_xact_lock(%s::bigint)", (lock_key(TableName(schema, "a")),)
        )
        held = db_project.run("sync", "--log-format", "json")
    assert held.exit_code == 75, held.output
    events = {
        e["name"]: e
        for e in map(json.loads, filter(None, held.stderr.splitlines()))
        if e.get("event") == "table.finished"
    }
    assert events[f"{schema}.a"]["status"] == "failure"
    assert (
        "another replicator run (a sync, `sync --follow` or `verify --repair` of this project, "
        "a copy of it or another host) is syncing" in (events[f"{schema}.a"]["error"])
    )
    assert events[f"{schema}.b"]["status"] == "success"
    assert json.loads(db_project.run("state", "show", f"{schema}.a").stdout)[f"{schema}.a"] is None
    # Released: the next run syncs it.
    assert db_project.run("sync").exit_code == 0
    assert assert_same_table(source_conn, dest_conn, schema, "a") == 5000


def test_two_project_copies_running_together_never_corrupt_the_destination(
    db_project, two_tables, dest_conn, source_conn, tmp_path
):
    schema = two_tables
    db_project.configure(schema, "a", "b", replication_key="updated_at")
    assert db_project.run("sync").exit_code == 0
    other = tmp_path / "other-host"
    shutil.copytree(db_project.path, other)
    for round_ in range(3):
        # the first round's loads through Spark, the others in each run's own process:
        # both engines write the table under the same lock
        engine = "0" if round_ == 0 else "1000000000"
        env = {**os.environ, **db_project.env, "REPLICATOR_SPARK_MIN_ROWS": engine}
        source_conn.execute(
            sql.SQL(
                "UPDATE {} SET v = %s, updated_at = clock_timestamp() WHERE id %% 7 = %s"
            ).format(sql.Identifier(schema, "a")),
            (f"round {round_}", round_),
        )
        runs = [
            subprocess.Popen(
                [sys.executable, "-m", "replicator", "sync", "-f", "--project-dir", str(folder)],
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for folder in (db_project.path, other)
        ]
        for run in runs:
            _out, err = run.communicate(timeout=300)
            assert run.returncode in (0, 75), err
            if run.returncode == 75:
                assert "is syncing destination table" in err
    for folder in (db_project.path, other):
        done = subprocess.run(
            [sys.executable, "-m", "replicator", "sync", "--project-dir", str(folder)],
            env=env,
            capture_output=True,
            text=True,
        )
        assert done.returncode == 0, done.stderr
    for table in "ab":
        assert assert_same_table(source_conn, dest_conn, schema, table) == 5000
