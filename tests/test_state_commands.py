"""status, refresh and state show / reset / set-cursor, as a user runs them."""

from __future__ import annotations

import json

import pytest
from psycopg import sql

from replicator.base.identifiers import TableName
from replicator.project.state import Cursor, RunOutcome, StateStore, TableState

PINNED_STATUS_KEYS = {
    "name",
    "mode",
    "cursor",
    "last_synced_at",
    "last_status",
    "pending_full_reload",
}


def _synced(project, name: str, cursor: Cursor | None) -> None:
    parsed = TableName.parse(name)
    StateStore(project.path / "sync-state").write(
        TableState(
            table=str(parsed),
            cursor=cursor,
            last_synced_at="2026-11-20T10:00:05Z",
            last_run=RunOutcome(
                run_id="r",
                started_at="s",
                finished_at="f",
                status="success",
                action="incremental",
                rows=7,
                reason="cursor x",
            ),
        ),
        parsed,
    )


@pytest.fixture
def configured(project):
    project.write_config(
        {
            "tables": [
                {"name": "public.orders", "replication_key": "updated_at"},
                {"name": '"Sales"."Order Lines"', "mode": "full-refresh"},
            ]
        }
    )
    _synced(
        project,
        "public.orders",
        Cursor(value="2026-11-20 10:00:00.5+00", type="timestamp with time zone"),
    )
    return project


def test_status_json_has_pinned_keys(configured):
    result = configured.run("status", "--json")
    assert result.exit_code == 0, result.output
    orders, lines = json.loads(result.stdout)
    assert set(orders) >= PINNED_STATUS_KEYS
    assert orders == orders | {
        "name": "public.orders",
        "mode": "incremental-deduped",
        "cursor": "2026-11-20 10:00:00.5+00",
        "last_synced_at": "2026-11-20T10:00:05Z",
        "last_run_at": "f",
        "last_status": "success",
        "rows": None,  # the destination's row count: not known without a connection
        "last_run_rows": 7,
        "pending_full_reload": False,
        "next_action": "incremental",
    }
    assert lines["name"] == '"Sales"."Order Lines"'
    assert lines["pending_full_reload"] is True
    assert lines["next_action"] == "full_reload: mode full-refresh"


def test_status_table_off_a_tty(configured):
    result = configured.run("status")
    assert result.exit_code == 0
    assert "public.orders" in result.stdout and "2026-11-20 10:00:00.5+00" in result.stdout


def test_refresh_marks_and_status_shows_pending(configured):
    result = configured.run("refresh", "orders")
    assert result.exit_code == 0, result.output
    assert "public.orders: marked for a full reload at the next sync" in result.stdout
    (orders, _) = json.loads(configured.run("status", "--json").stdout)
    assert orders["pending_full_reload"] is True
    assert orders["next_action"] == "full_reload: refresh requested"
    assert orders["cursor"] == "2026-11-20 10:00:00.5+00", "the cursor is kept"


def test_refresh_unknown_table_is_exit_2_and_writes_nothing(configured):
    before = {p: p.read_bytes() for p in (configured.path / "sync-state").iterdir()}
    result = configured.run("refresh", "public.ordres")
    assert result.exit_code == 2
    assert "table public.ordres is not in tables-config.json: did you mean public.orders?" in (
        result.stderr
    )
    assert {p: p.read_bytes() for p in (configured.path / "sync-state").iterdir()} == before


def test_state_show_and_reset(configured):
    shown = json.loads(configured.run("state", "show").stdout)
    assert shown["public.orders"]["cursor"]["value"] == "2026-11-20 10:00:00.5+00"
    assert shown['"Sales"."Order Lines"'] is None
    result = configured.run("state", "reset", "public.orders")
    assert result.exit_code == 0
    assert "public.orders: state removed; the next sync reloads it in full" in result.stdout
    assert json.loads(configured.run("state", "show", "public.orders").stdout) == {
        "public.orders": None
    }


def test_corrupt_state_shows_in_status_and_reset_repairs(configured):
    path = configured.path / "sync-state" / "public.orders.json"
    path.write_text('{"format_version": 1, "table": "public.orders", "cursor": {"val')
    result = configured.run("status")
    assert result.exit_code == 1
    assert f"{path}: corrupt or truncated sync-state file" in result.stdout
    assert configured.run("state", "show").exit_code == 1
    assert configured.run("state", "reset", "public.orders").exit_code == 0
    assert configured.run("status").exit_code == 0


@pytest.fixture
def timestamp_table(db_project, source_conn, schema):
    source_conn.execute(
        sql.SQL("CREATE TABLE {} (id int PRIMARY KEY, updated_at timestamptz NOT NULL)").format(
            sql.Identifier(schema, "events")
        )
    )
    name = f"{schema}.events"
    db_project.write_config({"tables": [{"name": name, "replication_key": "updated_at"}]})
    return name


def test_set_cursor_stores_the_value_as_postgres_prints_it(db_project, timestamp_table):
    _synced(
        db_project,
        timestamp_table,
        Cursor(value="2026-01-01 00:00:00+00", type="timestamp with time zone"),
    )
    result = db_project.run(
        "state",
        "set-cursor",
        timestamp_table,
        "2026-11-20 10:00:00.123456+02",
        env={"TZ": "America/New_York"},
    )
    assert result.exit_code == 0, result.output
    shown = json.loads(db_project.run("state", "show").stdout)[timestamp_table]
    assert shown["cursor"] == {
        "value": "2026-11-20 08:00:00.123456+00",
        "type": "timestamp with time zone",
    }


def test_set_cursor_rejects_a_value_of_the_wrong_type(db_project, timestamp_table):
    _synced(
        db_project,
        timestamp_table,
        Cursor(value="2026-01-01 00:00:00+00", type="timestamp with time zone"),
    )
    path = db_project.path / "sync-state" / f"{timestamp_table}.json"
    before = path.read_bytes()
    result = db_project.run("state", "set-cursor", timestamp_table, "yesterday-ish")
    assert result.exit_code == 2
    assert "'yesterday-ish' is not a valid timestamp with time zone" in result.stderr
    assert path.read_bytes() == before


def test_set_cursor_needs_a_first_sync(db_project, timestamp_table):
    result = db_project.run("state", "set-cursor", timestamp_table, "2026-11-20")
    assert result.exit_code == 1
    assert "has no state yet" in result.stderr
