"""What a replication-key cursor cannot see: rows with a NULL key are copied anyway, and the
rest is said where it happens (check, the sync's log, set-cursor, status)."""

from __future__ import annotations

import json

import pytest
from dbcompare import assert_same_table
from psycopg import sql

pytestmark = pytest.mark.spark


@pytest.fixture
def orders(source_conn, schema):
    """Orders whose updated_at may be NULL; rows spread over a day."""
    source_conn.execute(
        sql.SQL(
            "CREATE TABLE {s}.orders (id int PRIMARY KEY, note text, updated_at timestamptz); "
            "INSERT INTO {s}.orders SELECT g, 'n', now() - interval '1 day' + g * interval "
            "'1 min' FROM generate_series(1, 100) g; "
            "INSERT INTO {s}.orders VALUES (101, 'null from the start', NULL)"
        ).format(s=sql.Identifier(schema))
    )
    return schema


def test_rows_with_a_null_key_are_copied_by_every_sync(db_project, orders, source_conn, dest_conn):
    db_project.configure(orders, "orders", replication_key="updated_at")
    assert db_project.run("sync").exit_code == 0
    source_conn.execute(
        sql.SQL(
            "INSERT INTO {s}.orders VALUES (102, 'inserted with a NULL key', NULL); "
            "UPDATE {s}.orders SET note = 'updated to a NULL key', updated_at = NULL "
            "WHERE id = 5; UPDATE {s}.orders SET note = 'still NULL, changed' WHERE id = 101"
        ).format(s=sql.Identifier(orders))
    )
    synced = db_project.run("sync")
    assert synced.exit_code == 0, synced.output
    assert assert_same_table(source_conn, dest_conn, orders, "orders") == 102
    noop = db_project.run("sync", "--log-format", "json")
    actions = [e["action"] for e in map(json.loads, noop.stderr.splitlines()) if "action" in e]
    assert actions[-1] == "noop", "NULL-key rows that did not change are a no-op"


def test_check_names_the_keys_a_cursor_misses_with_their_fix(db_project, orders, source_conn):
    source_conn.execute(
        sql.SQL(
            "CREATE TABLE {s}.events (id int PRIMARY KEY, at timestamp NOT NULL); "
            "CREATE INDEX ON {s}.events (at); CREATE INDEX ON {s}.orders (updated_at)"
        ).format(s=sql.Identifier(orders))
    )
    db_project.write_config(
        {
            "tables": [
                {"name": f"{orders}.orders", "replication_key": "updated_at"},
                {"name": f"{orders}.events", "replication_key": "at"},
            ]
        }
    )
    (zone,) = source_conn.execute(
        "SELECT reset_val FROM pg_settings WHERE name = 'TimeZone'"
    ).fetchone()
    checked = db_project.run("check").stdout
    assert (
        f"warn  {orders}.orders: replication key updated_at can be NULL: no cursor can order "
        "such rows" in checked
    )
    assert "SET NOT NULL, or a model that coalesces it" in checked
    assert f"warn  {orders}.events: replication key at is a timestamp without time zone" in checked
    assert f"AT TIME ZONE '{zone}'" in checked and "<" not in checked
    # The same key as a domain (NOT NULL there, the column itself nullable): its base type
    # says the same, and the domain's NOT NULL that no NULL can come.
    source_conn.execute(
        sql.SQL(
            "CREATE DOMAIN {s}.moment AS timestamp NOT NULL; "
            "CREATE TABLE {s}.visits (id int PRIMARY KEY, at {s}.moment); "
            "CREATE INDEX ON {s}.visits (at)"
        ).format(s=sql.Identifier(orders))
    )
    db_project.write_config({"tables": [{"name": f"{orders}.visits", "replication_key": "at"}]})
    domain = db_project.run("check").stdout
    assert f"warn  {orders}.visits: replication key at is a timestamp without time zone" in domain
    assert "can be NULL" not in domain, domain


def test_rows_that_vanish_at_the_cursor_are_reported(db_project, orders, source_conn):
    db_project.configure(orders, "orders", replication_key="updated_at")
    assert db_project.run("sync").exit_code == 0
    # The cursor's window holds row 100 (the newest key) and 101 (a NULL key); row 99 is
    # behind the cursor, where no cursor looks.
    source_conn.execute(
        sql.SQL("DELETE FROM {}.orders WHERE id >= 99").format(sql.Identifier(orders))
    )
    synced = db_project.run("sync")
    assert synced.exit_code == 0
    assert (
        f"{orders}.orders: 2 row(s) the last sync read at or past the cursor are gone from the "
        "source" in synced.stderr
    ), synced.stderr
    assert "deletes are not propagated for this table: set `deletes`, or run" in synced.stderr
    source_conn.execute(sql.SQL("TRUNCATE {}.orders").format(sql.Identifier(orders)))
    truncated = db_project.run("sync")
    assert (
        f"{orders}.orders: the source returns no rows, but the destination table still has "
        "rows" in truncated.stderr
    ), truncated.stderr


def test_a_cursor_set_past_the_source_needs_force_and_status_flags_it(
    db_project, orders, source_conn
):
    db_project.configure(orders, "orders", replication_key="updated_at")
    assert db_project.run("sync").exit_code == 0
    typo = db_project.run("state", "set-cursor", f"{orders}.orders", "2062-01-01 00:00:00+00")
    assert typo.exit_code == 2
    assert "is past the source's newest updated_at" in typo.stderr
    assert "add --force" in typo.stderr
    forced = db_project.run(
        "state", "set-cursor", f"{orders}.orders", "2062-01-01 00:00:00+00", "--force"
    )
    assert forced.exit_code == 0, forced.output
    (row,) = json.loads(db_project.run("status", "--json").stdout)
    assert row["cursor_ahead"] is True and row["lag"] is None
    grid = db_project.run("status").stdout
    assert "the cursor (2062-01-01 00:00:00+00) is past the source's newest key" in grid
    assert "Nothing to do when the newest rows were deleted" in grid.replace("\n", " ")
    assert f"replicator state set-cursor {orders}.orders '20" in grid, "a value to paste, quoted"
