"""`mode: "cdc"` in a run (sync/cdc): loads beside the drain, reloads, `sync --follow`, and what
`check`, `status` and `compile` say of `cdc` tables."""

from __future__ import annotations

import json
import signal
import threading
import time
import uuid

import pytest
from cdc_tables import (
    configure_cdc,
    create_orders,
    on_table,
    published_tables,
    slot_of,
)
from dbcompare import assert_same_table
from following import Follow
from psycopg import sql

pytestmark = pytest.mark.spark


def _copied_rows(dest_conn, schema):
    if dest_conn.execute("SELECT to_regclass(%s)", (f'"{schema}".orders',)).fetchone()[0] is None:
        return 0
    return dest_conn.execute(
        sql.SQL("SELECT count(*) FROM {}").format(sql.Identifier(schema, "orders"))
    ).fetchone()[0]


def test_writers_during_the_first_load_are_neither_lost_nor_applied_twice(
    cdc_project, schema, pg_servers, source_conn, dest_conn
):

    import psycopg

    with psycopg.connect(pg_servers.source_url, autocommit=True) as setup:
        create_orders(setup, schema, rows=20_000)
    configure_cdc(cdc_project, schema, "orders")
    stop = threading.Event()
    written = []

    def write() -> None:
        with psycopg.connect(pg_servers.source_url, autocommit=True) as conn:
            conn.execute("SET synchronous_commit = on")
            n = 0
            while not stop.is_set():
                n += 1
                with conn.transaction():
                    on_table(
                        conn, schema, "INSERT INTO {t} VALUES (%s, 'w', %s, NULL)", 100_000 + n, n
                    )
                    on_table(
                        conn,
                        schema,
                        "UPDATE {t} SET amount = amount + 1 WHERE id = %s",
                        n % 500 + 1,
                    )
                    on_table(conn, schema, "DELETE FROM {t} WHERE id = %s", 19_000 + n)
                written.append(n)

    thread = threading.Thread(target=write)
    thread.start()
    try:
        cdc_project.sync()  # the first load, with Spark, while the writer runs
        cdc_project.sync()
    finally:
        stop.set()
        thread.join()
    assert len(written) > 10
    cdc_project.sync()
    assert_same_table(source_conn, dest_conn, schema, "orders")


def test_check_status_and_cdc_drop(cdc_project, schema, writer, source_conn, dest_conn):
    create_orders(writer, schema)
    writer.execute(sql.SQL("CREATE TABLE {} (n int)").format(sql.Identifier(schema, "nokey")))
    configure_cdc(cdc_project, schema, "orders", "nokey")
    checked = cdc_project.run("check")
    assert "ok    cdc: wal_level is logical" in checked.output
    assert "warn  cdc: max_slot_wal_keep_size is unlimited" in checked.output
    assert (
        "ok    cdc: no slot yet: the first sync creates the slot and publication" in checked.output
    )
    assert f"ok    {schema}.orders: replica identity default: the log names its rows" in (
        checked.output
    )
    assert f"error {schema}.nokey: the source table has no primary key" in checked.output
    synced = cdc_project.run("sync")
    assert synced.exit_code == 1  # nokey fails, and is never added to the publication
    assert published_tables(source_conn, cdc_project) == [("orders",)]
    writer.execute(sql.SQL("DELETE FROM {}").format(sql.Identifier(schema, "nokey")))  # allowed

    on_table(writer, schema, "UPDATE {t} SET note = repeat('x', 1000)")
    status = cdc_project.run("status", "--json")
    row = next(r for r in json.loads(status.stdout) if r["name"].endswith("orders"))
    assert row["mode"] == "cdc" and row["cursor"].count("/") == 1
    assert row["slot_lag_bytes"] > 100_000
    grid = cdc_project.run("status").output
    assert f"cdc: slot {slot_of(cdc_project)} retains" in grid

    slot = slot_of(cdc_project)
    dropped = cdc_project.run("cdc", "drop")
    assert dropped.exit_code == 0, dropped.output
    assert "dropped replication slot" in dropped.output
    assert not source_conn.execute(
        "SELECT 1 FROM pg_replication_slots WHERE slot_name = %s", (slot,)
    ).fetchall()
    configure_cdc(cdc_project, schema, "orders")
    again = cdc_project.sync()
    assert "full_reload" in again.stderr and "reason: slot dropped" in again.stderr
    assert assert_same_table(source_conn, dest_conn, schema, "orders") == 100


def test_follow_applies_changes_until_sigterm_and_sums_up_its_webhooks(
    cdc_project, schema, writer, source_conn, dest_conn, httpserver
):
    create_orders(writer, schema)
    hook = httpserver.url_for("/hook")
    configure_cdc(cdc_project, schema, "orders", webhook={"url": hook, "summary_interval": 3600})
    httpserver.expect_request("/hook", method="POST").respond_with_data("ok")
    follow = Follow(cdc_project, {"REPLICATOR_SPARK_MIN_ROWS": "10000000"})
    try:
        on_table(writer, schema, "DELETE FROM {t} WHERE id <= 50")
        on_table(writer, schema, "INSERT INTO {t} VALUES (500, 'followed', 1, NULL)")
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and _copied_rows(dest_conn, schema) != 51:
            time.sleep(0.2)
        assert_same_table(source_conn, dest_conn, schema, "orders")
        # Two more runs after the one that applied the changes, however slow the machine:
        # their successes are summed up in the post sent when the signal stops it. The run
        # that applied them may not have said it finished yet (its commit comes first): the
        # runs finished now, that one, then two more.
        finished = follow.runs_finished()
        while time.monotonic() < deadline and follow.runs_finished() < finished + 3:
            time.sleep(0.1)
    finally:
        code, stderr = follow.stop(signal.SIGTERM)
    assert code == 0, stderr[-3000:]
    assert "follow: stopped by a signal after" in stderr
    assert "cdc: slot" in stderr and "bytes of log written since" in stderr
    posts = [request.get_json() for request, _ in httpserver.log]
    assert len(posts) == 2, [p.get("runs") for p in posts]  # the first run, then a summary
    assert posts[0]["runs"] == 1 and posts[1]["runs"] >= 2
    assert all(p["event"] == "sync.finished" and p["status"] == "success" for p in posts)


def test_a_reload_of_one_table_while_another_keeps_its_changes(
    cdc_project, schema, writer, source_conn, dest_conn
):
    create_orders(writer, schema, "orders")
    create_orders(writer, schema, "items")
    configure_cdc(cdc_project, schema, "orders", "items")
    cdc_project.sync()
    on_table(writer, schema, "UPDATE {t} SET note = 'pending'", table="items")
    on_table(writer, schema, "UPDATE {t} SET note = 'reloaded'", table="orders")
    compiled = cdc_project.run("compile")
    assert compiled.exit_code == 0, compiled.output
    reloaded = cdc_project.sync("-f", "-s", "orders")  # items is not selected: kept for later
    assert "reason: --full-refresh" in reloaded.stderr
    on_table(writer, schema, "UPDATE {t} SET amount = 0 WHERE id = 1", table="orders")
    writer.execute(
        sql.SQL("ALTER TABLE {} ADD COLUMN extra int DEFAULT 7").format(
            sql.Identifier(schema, "items")
        )
    )
    on_table(writer, schema, "DELETE FROM {t} WHERE id = 2", table="items")
    synced = cdc_project.sync()
    assert "items: full_reload" in synced.stderr and "reason: schema changed" in synced.stderr
    assert "orders: incremental, 1 rows" in synced.stderr
    assert_same_table(source_conn, dest_conn, schema, "orders")
    assert assert_same_table(source_conn, dest_conn, schema, "items") == 99


def test_a_table_loaded_in_the_run_that_drains_another_loses_nothing(
    cdc_project, schema, pg_servers, source_conn, dest_conn
):
    """orders goes on from the log while items has its first load in the same run, with a
    writer changing items throughout: the drain for orders must keep items' changes made
    after items' snapshot in the slot (items applies them at its next run)."""

    import psycopg

    with psycopg.connect(pg_servers.source_url, autocommit=True) as setup:
        create_orders(setup, schema, "orders")
        create_orders(setup, schema, "items", rows=20_000)
    configure_cdc(cdc_project, schema, "orders")
    cdc_project.sync()
    configure_cdc(cdc_project, schema, "orders", "items")
    stop = threading.Event()

    def write() -> None:
        with psycopg.connect(pg_servers.source_url, autocommit=True) as conn:
            conn.execute("SET synchronous_commit = on")
            n = 0
            while not stop.is_set():
                n += 1
                on_table(
                    conn,
                    schema,
                    "UPDATE {t} SET amount = %s WHERE id = %s",
                    n,
                    n % 20_000 + 1,
                    table="items",
                )
                on_table(conn, schema, "UPDATE {t} SET amount = %s WHERE id = %s", n, n % 100 + 1)

    thread = threading.Thread(target=write)
    thread.start()
    try:
        both = cdc_project.sync()  # items: first load; orders: the drain
        assert "items: full_reload" in both.stderr and "orders: incremental" in both.stderr
    finally:
        stop.set()
        thread.join()
    cdc_project.sync()
    assert_same_table(source_conn, dest_conn, schema, "orders")
    assert_same_table(source_conn, dest_conn, schema, "items")


def test_a_table_that_cannot_apply_reloads_and_does_not_stop_the_others(
    cdc_project, schema, writer, source_conn, dest_conn
):
    create_orders(writer, schema, "orders", rows=5)
    create_orders(writer, schema, "items")
    big = "".join(uuid.uuid4().hex for _ in range(600))
    on_table(writer, schema, "UPDATE {t} SET big = %s", big)
    configure_cdc(cdc_project, schema, "orders", "items")
    cdc_project.sync()
    dest_conn.execute(
        sql.SQL("DELETE FROM {} WHERE id = 1").format(sql.Identifier(schema, "orders"))
    )
    on_table(writer, schema, "UPDATE {t} SET note = 'needs the TOASTed value' WHERE id = 1")
    on_table(writer, schema, "UPDATE {t} SET note = 'goes on'", table="items")
    failed = cdc_project.run("sync")
    assert failed.exit_code == 1
    assert "left a TOASTed value as it was, which the copy does not hold either" in failed.stderr
    assert "items: incremental, 100 rows" in failed.stderr
    assert_same_table(source_conn, dest_conn, schema, "items")
    on_table(writer, schema, "UPDATE {t} SET note = 'and on'", table="items")
    healed = cdc_project.sync()
    assert "reason: the log could not be applied: " in healed.stderr, healed.stderr
    assert_same_table(source_conn, dest_conn, schema, "orders")
    assert_same_table(source_conn, dest_conn, schema, "items")


def test_a_table_left_out_by_select_does_not_stop_the_one_selected(
    cdc_project, schema, writer, source_conn, dest_conn, monkeypatch
):
    monkeypatch.setattr("replicator.cdc.drain.BATCH_CHANGES", 5)  # many small batches
    create_orders(writer, schema, "orders")
    create_orders(writer, schema, "items")
    configure_cdc(cdc_project, schema, "orders", "items")
    cdc_project.sync()
    for n in range(1, 21):
        on_table(writer, schema, "UPDATE {t} SET amount = %s WHERE id = %s", n, n, table="items")
    for n in range(1, 21):
        on_table(writer, schema, "UPDATE {t} SET amount = %s WHERE id = %s", n, n)
    only = cdc_project.sync("-s", "orders")
    assert "orders: incremental, 20 rows" in only.stderr
    assert_same_table(source_conn, dest_conn, schema, "orders")
    later = cdc_project.sync("-s", "items")  # its changes waited in the slot
    assert "items: incremental, 20 rows" in later.stderr
    assert_same_table(source_conn, dest_conn, schema, "items")


def test_a_shape_change_seen_only_in_the_log_reloads_the_table(
    cdc_project, schema, writer, source_conn, dest_conn
):
    """DDL committed after a run planned the table but before its drain: the log's own
    Relation message says the table changed shape; that table is reloaded, none lost."""
    from replicator.base.identifiers import TableName
    from replicator.cdc.capture_table import CaptureTable
    from replicator.cdc.drain import drain
    from replicator.cdc.source.slot import flushed_lsn, slot_info
    from replicator.plan.inspect_table import inspect_source
    from replicator.project.project import Project

    create_orders(writer, schema)
    configure_cdc(cdc_project, schema, "orders")
    cdc_project.sync()
    project = Project.load(cdc_project.path)
    table = project.config.tables[0]
    _, planned_before = inspect_source(source_conn, table, project.templates)  # the plan's view
    writer.execute(
        sql.SQL("ALTER TABLE {} ADD COLUMN region text").format(sql.Identifier(schema, "orders"))
    )
    on_table(writer, schema, "UPDATE {t} SET region = 'eu' WHERE id = 1")
    names = json.loads((cdc_project.path / "sync-state" / "cdc.json").read_text())
    (applied,) = dest_conn.execute(
        "SELECT applied_lsn - '0/0'::pg_lsn FROM _replicator.cdc_applied WHERE schema_name = %s",
        (schema,),
    ).fetchone()
    captured = CaptureTable(TableName(schema, "orders"), planned_before, int(applied))
    drained = drain(
        cdc_project.env["REPLICATOR_SOURCE_URL"],
        cdc_project.env["REPLICATOR_DEST_URL"],
        names["slot"],
        names["publication"],
        [captured],
        slot_info(source_conn, names["slot"]).confirmed,
        flushed_lsn(source_conn),
    )
    assert captured.drift == "in the log: region added" and captured.changes == 0
    assert drained.end > 0
    synced = cdc_project.sync()
    assert "reason: schema changed" in synced.stderr
    assert assert_same_table(source_conn, dest_conn, schema, "orders") == 100


def test_a_table_switched_to_cdc_reloads_as_compile_says(
    cdc_project, schema, writer, source_conn, dest_conn
):
    """full-refresh, then cdc: compile and status predict the reload the sync does (they
    said `incremental (cursor none ...)`)."""
    create_orders(writer, schema)
    cdc_project.write_config({"tables": [{"name": f"{schema}.orders", "mode": "full-refresh"}]})
    cdc_project.sync()
    configure_cdc(cdc_project, schema, "orders")
    reason = "mode changed to cdc: the copy has no log position"
    compiled = cdc_project.run("compile")
    assert f"-- next sync: full_reload ({reason})" in compiled.stdout, compiled.stdout
    status = json.loads(cdc_project.run("status", "--json").stdout)
    assert status[0]["next_action"] == f"full_reload: {reason}"
    synced = cdc_project.sync()
    assert f"{schema}.orders: full_reload" in synced.stderr and f"reason: {reason}" in synced.stderr
    on_table(writer, schema, "UPDATE {t} SET note = 'later' WHERE id = 7")
    assert f"{schema}.orders: incremental" in cdc_project.sync().stderr
    assert_same_table(source_conn, dest_conn, schema, "orders")


def test_status_and_compile_follow_a_table_between_cdc_and_a_cursor_mode(
    cdc_project, schema, writer, source_conn, dest_conn
):
    """A cursor table switched to cdc, and back: status crashed on the timestamp cursor
    (read as a log position), and compile and status predicted a failure (the log position
    cast to the key's type) where the sync reloads; each says the reload the sync does."""
    writer.execute(
        sql.SQL(
            "CREATE TABLE {t} (id int PRIMARY KEY, note text, updated_at timestamptz NOT NULL "
            "DEFAULT now()); INSERT INTO {t} (id, note) SELECT g, 'n' FROM generate_series(1, 30) g"
        ).format(t=sql.Identifier(schema, "orders"))
    )
    cursor = {"tables": [{"name": f"{schema}.orders", "replication_key": "updated_at"}]}
    cdc_project.write_config(cursor)
    cdc_project.sync()
    for config, reason in (
        ({"tables": [{"name": f"{schema}.orders", "mode": "cdc"}]}, "mode changed to cdc"),
        (cursor, "schema changed: replication key changed: none -> updated_at"),
    ):
        cdc_project.write_config(config)
        status = cdc_project.run("status", "--json")
        assert status.exit_code == 0, status.output
        assert json.loads(status.stdout)[0]["next_action"].startswith(f"full_reload: {reason}")
        compiled = cdc_project.run("compile")
        assert compiled.exit_code == 0, compiled.output
        assert f"-- next sync: full_reload ({reason}" in compiled.stdout
        synced = cdc_project.sync()
        assert f"{schema}.orders: full_reload" in synced.stderr
        assert f"reason: {reason}" in synced.stderr, synced.stderr
        assert_same_table(source_conn, dest_conn, schema, "orders")


def test_the_drain_says_the_position_its_result_starts_from(cdc_project, schema, writer):
    """A table without changes for a few runs: `applying the log (lsn X)` named its last
    applied change's position while the result said `lsn Y -> Z` (a newcomer trial)."""
    create_orders(writer, schema, "orders")
    create_orders(writer, schema, "items")
    configure_cdc(cdc_project, schema, "orders", "items")
    cdc_project.sync()
    for n in range(2):  # changes to items only: the slot and orders' state move on
        on_table(writer, schema, "UPDATE {t} SET note = %s WHERE id = 1", f"n{n}", table="items")
        cdc_project.sync()
    on_table(writer, schema, "UPDATE {t} SET note = 'now' WHERE id = 1")
    stderr = cdc_project.sync("--log-format", "json").stderr
    events = [json.loads(line) for line in stderr.splitlines()]
    orders = f"{schema}.orders"
    started = next(e for e in events if e.get("event") == "table.started" and e["name"] == orders)
    finished = next(e for e in events if e.get("event") == "table.finished" and e["name"] == orders)
    assert started["reason"] == f"lsn {finished['cursor_from']}", (started, finished)
    assert finished["reason"].startswith(f"lsn {finished['cursor_from']} -> ")


def test_compile_shows_the_apply_a_sync_runs(cdc_project, schema, writer):
    create_orders(writer, schema, rows=5)
    configure_cdc(cdc_project, schema, "orders")
    cdc_project.sync()
    compiled = cdc_project.run("compile", "--json")
    assert compiled.exit_code == 0, compiled.output
    (document,) = json.loads(compiled.stdout)
    steps = document["script"]["cdc_apply"]
    assert [s["sql"].split()[0] for s in steps] == [
        "BEGIN",
        "CREATE",
        "DELETE",
        "SELECT",
        "SET",
        "SET",
        "UPDATE",
        "RESET",
        "RESET",
        "INSERT",
        "INSERT",
        "COMMIT",
    ]
    assert document["sql"]["cdc_apply"][6].startswith(f'UPDATE "{schema}"."orders" AS d')
    assert document["sql"]["cdc_apply"][9].startswith(f'INSERT INTO "{schema}"."orders" AS d')
    assert "-- cdc apply of a batch" in cdc_project.run("compile").stdout
    with writer.transaction():  # a key twice in the batch: the reduction runs
        on_table(writer, schema, "UPDATE {t} SET note = 'x' WHERE id = 1")
        on_table(writer, schema, "UPDATE {t} SET note = 'y' WHERE id = 1")
    synced = cdc_project.sync("-v")
    for step in steps[1:10]:
        assert step["sql"] in synced.stderr, step["sql"]
