"""`replicator status` tells the truth: every run's outcome (a run that could not connect
included), the next action as the sync will decide it, lag behind the newest copied key,
and the destination's row count."""

from __future__ import annotations

import fcntl
import json
import os
import pty
import re
import select
import struct
import subprocess
import sys
import termios
import time

import pytest
from psycopg import sql

from replicator.postgres.pgcluster import free_port

pytestmark = pytest.mark.spark


@pytest.fixture
def orders(source_conn, schema):
    table = sql.Identifier(schema, "orders")
    source_conn.execute(
        sql.SQL(
            "CREATE TABLE {} (id int PRIMARY KEY, note text, "
            "updated_at timestamptz NOT NULL DEFAULT now())"
        ).format(table)
    )
    source_conn.execute(
        sql.SQL(
            "INSERT INTO {} (id, note, updated_at) "
            "SELECT g, 'n', now() - interval '1 day' + g * interval '1 minute' "
            "FROM generate_series(1, 30) g"
        ).format(table)
    )
    return schema


def _status(project, **env) -> dict:
    done = project.run("status", "--json", env=env or None)
    assert done.exit_code == 0, done.output
    (row,) = json.loads(done.stdout)
    return row


def test_a_run_that_could_not_connect_is_the_last_run(db_project, orders):
    db_project.configure(orders, "orders", replication_key="updated_at")
    assert db_project.run("sync").exit_code == 0
    synced = _status(db_project)
    assert synced["last_status"] == "success"
    unreachable = f"postgresql://postgres@127.0.0.1:{free_port()}/postgres?connect_timeout=2"
    failed = db_project.run("sync", env={"REPLICATOR_DEST_URL": unreachable})
    assert failed.exit_code == 1
    after = _status(db_project, REPLICATOR_DEST_URL=unreachable)
    assert after["last_status"] == "failure"
    assert after["last_error"].startswith("cannot connect to the destination database")
    assert after["last_run_at"] > synced["last_run_at"]
    assert after["last_synced_at"] == synced["last_synced_at"], "the last success is kept"
    assert after["cursor"] == synced["cursor"]
    grid = db_project.run("status", env={"REPLICATOR_DEST_URL": unreachable}).stdout
    assert "failure" in grid and "destination not inspected: cannot connect" in grid


def _on_a_terminal(project, *args, env) -> tuple[int, str, str]:
    """`replicator <args>` as its own process with stdout on a pseudo-terminal 250 columns
    wide (where the summary table is shown): exit code, stdout without colours, stderr."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 50, 250, 0, 0))
    with subprocess.Popen(
        [sys.executable, "-m", "replicator", *args, "--project-dir", str(project.path)],
        env={**os.environ, **project.env, **env, "TERM": "xterm", "COLUMNS": "250"},
        stdin=subprocess.DEVNULL,
        stdout=slave,
        stderr=subprocess.PIPE,
        text=True,
    ) as process:
        os.close(slave)
        out, deadline = b"", time.monotonic() + 120
        while time.monotonic() < deadline:
            if select.select([master], [], [], 1)[0]:
                try:
                    chunk = os.read(master, 65536)
                except OSError:  # EIO: the process closed its end
                    break
                if not chunk:
                    break
                out += chunk
        os.close(master)
        stderr = process.stderr.read()
        code = process.wait(timeout=30)
    return code, re.sub(r"\x1b\[[0-9;?]*[a-zA-Z]", "", out.decode()), stderr


def test_an_unreachable_database_is_said_once_not_once_per_table(db_project, orders, source_conn):
    """Four tables, a destination nobody listens on: the error is logged once with how many
    tables were not synced, and the summary says it once; every table's state records the
    failed run, and the webhook lists every table."""
    for name in ("b", "c", "d"):
        source_conn.execute(
            sql.SQL("CREATE TABLE {} (id int PRIMARY KEY)").format(sql.Identifier(orders, name))
        )
    names = [f"{orders}.{n}" for n in ("orders", "b", "c", "d")]
    db_project.write_config({"tables": [{"name": n, "mode": "full-refresh"} for n in names]})
    assert db_project.run("sync", "-s", names[0]).exit_code == 0
    unreachable = f"postgresql://postgres@127.0.0.1:{free_port()}/postgres?connect_timeout=2"
    code, summary, stderr = _on_a_terminal(
        db_project, "sync", env={"REPLICATOR_DEST_URL": unreachable}
    )
    assert code == 1, stderr
    error = "cannot connect to the destination database"
    assert stderr.count(error) == 1, stderr
    assert "4 of 4 table(s) not synced" in stderr, stderr
    assert "sync finished: 0 succeeded, 4 failed" in stderr
    assert summary.count(error) == 1, summary
    assert "│ 4 tables: " in summary and " and 1 more " in summary, summary
    rows = json.loads(
        db_project.run("status", "--json", env={"REPLICATOR_DEST_URL": unreachable}).stdout
    )
    assert [(r["name"], r["last_status"]) for r in rows] == [(n, "failure") for n in names]
    assert all(r["last_error"].startswith(error) for r in rows)
    verified = db_project.run("verify", env={"REPLICATOR_DEST_URL": unreachable})
    assert verified.exit_code == 1
    assert verified.stderr.count(error) == 1, verified.stderr
    assert verified.stdout.count(error) == 1 and "4 tables: " in verified.stdout, verified.stdout
    assert "4 of 4 table(s) not verified" in verified.stderr


def test_next_is_the_plan_the_sync_will_follow(db_project, orders, source_conn, dest_conn):
    db_project.configure(orders, "orders", replication_key="updated_at")
    assert db_project.run("sync").exit_code == 0
    assert _status(db_project)["next_action"] == "incremental"
    dest_conn.execute(sql.SQL("DROP TABLE {}").format(sql.Identifier(orders, "orders")))
    row = _status(db_project)
    assert row["next_action"] == "full_reload: destination table missing"
    assert row["pending_full_reload"] is True
    assert row["rows"] is None
    assert db_project.run("sync").exit_code == 0
    source_conn.execute(
        sql.SQL("ALTER TABLE {} ADD COLUMN region text").format(sql.Identifier(orders, "orders"))
    )
    assert _status(db_project)["next_action"] == (
        "full_reload: schema changed: column added: region text"
    )
    compiled = db_project.run("compile").stdout
    assert "-- next sync: full_reload (schema changed: column added: region text)" in compiled


def test_lag_is_behind_the_newest_copied_key_and_rows_are_the_destinations(
    db_project, orders, source_conn
):
    db_project.configure(orders, "orders", replication_key="updated_at")
    assert db_project.run("sync").exit_code == 0
    row = _status(db_project)
    assert row["lag"] == "00:00:00", "right after a sync nothing is behind"
    assert row["rows"] == 30 and row["last_run_rows"] == 30
    source_conn.execute(
        sql.SQL(
            "UPDATE {} SET note = 'x', updated_at = now() + interval '2 hours' WHERE id <= 5"
        ).format(sql.Identifier(orders, "orders"))
    )
    assert _status(db_project)["lag"].startswith("1 day 01:3")
    assert db_project.run("sync").exit_code == 0
    row = _status(db_project)
    assert row["lag"] == "00:00:00"
    assert row["rows"] == 30, "the destination still holds 30 rows"
    assert row["last_run_rows"] == 6, "what the last run read: 5 changed, 1 at the cursor"


def test_a_slow_model_does_not_make_status_hang(db_project, orders, source_conn, monkeypatch):
    """status reads the newest key through the model; a model slower than the limit gets a
    note instead of a hang (the limit shortened here from its 10 s)."""
    from replicator.commands import status

    db_project.configure(orders, "orders", replication_key="updated_at")
    # The model's text stays what the copy was loaded with (another text would reload it);
    # how long it sleeps is a value in the source, 0 during the sync, 3 s after it.
    source_conn.execute(f"CREATE TABLE {orders}.slowness AS SELECT 0 AS seconds")
    db_project.write(
        f"models/{orders}/orders.sql",
        "SELECT t.* FROM {{ source }} AS t CROSS JOIN "
        f"(SELECT pg_sleep(seconds) FROM {orders}.slowness) AS slow",
    )
    assert db_project.run("sync").exit_code == 0
    source_conn.execute(f"UPDATE {orders}.slowness SET seconds = 3")
    monkeypatch.setattr(status, "POSITION_TIMEOUT_SECONDS", 1)
    done = db_project.run("status")
    assert done.exit_code == 0, done.output
    assert (
        f"{orders}.orders: lag not computed: its model (models/{orders}/orders.sql) took over "
        "1 s to return the newest key" in done.stdout
    )
