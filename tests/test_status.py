"""`replicator status` tells the truth: every run's outcome (a run that could not connect
included), the next action as the sync will decide it, lag behind the newest copied key,
and the destination's row count."""

from __future__ import annotations

import json

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


def _config(project, schema):
    project.write_config(
        {"tables": [{"name": f"{schema}.orders", "replication_key": "updated_at"}]}
    )


def test_a_run_that_could_not_connect_is_the_last_run(db_project, orders):
    _config(db_project, orders)
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


def test_next_is_the_plan_the_sync_will_follow(db_project, orders, source_conn, dest_conn):
    _config(db_project, orders)
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
    _config(db_project, orders)
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


def test_a_slow_model_does_not_make_status_hang(db_project, orders, monkeypatch):
    """status reads the newest key through the model; a model slower than the limit gets a
    note instead of a hang (the limit shortened here from its 10 s)."""
    from replicator.commands import status

    _config(db_project, orders)
    assert db_project.run("sync").exit_code == 0
    db_project.write(
        f"models/{orders}/orders.sql",
        "SELECT t.* FROM {{ source }} AS t CROSS JOIN (SELECT pg_sleep(3)) AS slow",
    )
    monkeypatch.setattr(status, "POSITION_TIMEOUT_SECONDS", 1)
    done = db_project.run("status")
    assert done.exit_code == 0, done.output
    assert (
        f"{orders}.orders: lag not computed: its model (models/{orders}/orders.sql) took over "
        "1 s to return the newest key" in done.stdout
    )
