"""Backfills the user chooses for `mode: "cdc"`: a copy adopted without one
(`initial_load: "skip"`), and `cdc restart` after a lost or dropped slot, which repairs the
copies to the new slot instead of reloading them. Against real servers, without Spark."""

from __future__ import annotations

import json
import uuid

import pytest
from cdc_tables import slot_of
from dbcompare import assert_same_table, row_hashes
from engines import IN_PROCESS
from psycopg import sql


@pytest.fixture
def project(cdc_project):
    cdc_project.env.update(IN_PROCESS)
    return cdc_project


def _create(conn, schema, table="orders", rows=100):
    target = sql.Identifier(schema, table)
    conn.execute(
        sql.SQL("CREATE TABLE {} (id int PRIMARY KEY, note text, amount numeric)").format(target)
    )
    conn.execute(
        sql.SQL("INSERT INTO {} SELECT g, 'n' || g, g * 1.5 FROM generate_series(1, %s) g").format(
            target
        ),
        (rows,),
    )


def _run(conn, schema, statement, *params, table="orders"):
    conn.execute(sql.SQL(statement).format(t=sql.Identifier(schema, table)), params or None)


def _config(project, schema, *tables, skip=()):
    project.write_config(
        {
            "tables": [
                {
                    "name": f"{schema}.{t}",
                    "mode": "cdc",
                    **({"initial_load": "skip"} if t in skip else {}),
                }
                for t in tables
            ]
        }
    )


def _keys(conn, schema, table="orders"):
    query = sql.SQL("SELECT id FROM {} ORDER BY id").format(sql.Identifier(schema, table))
    return [row[0] for row in conn.execute(query).fetchall()]


def test_skip_adopts_the_copy_at_the_slot_position_and_applies_later_changes(
    project, schema, writer, source_conn, dest_conn
):
    _create(writer, schema, rows=100)
    dest_conn.execute(  # the copy a user made by other means: here, the first 5 rows only
        sql.SQL(
            "CREATE TABLE {} (id int PRIMARY KEY, note text, amount numeric); "
            "INSERT INTO {} SELECT g, 'n' || g, g * 1.5 FROM generate_series(1, 5) g"
        ).format(sql.Identifier(schema, "orders"), sql.Identifier(schema, "orders"))
    )
    _config(project, schema, "orders", skip=("orders",))
    compiled = project.run("compile")
    assert compiled.exit_code == 0, compiled.output
    assert "start without backfill" in compiled.stdout and "'<slot position>'" in compiled.stdout
    first = project.sync()
    assert "reason: no state: initial_load skip: destination table adopted, applies the log" in (
        first.stderr
    ), first.stderr
    assert _keys(dest_conn, schema) == [1, 2, 3, 4, 5]  # the 95 others were never copied

    _run(writer, schema, "INSERT INTO {t} VALUES (1000, 'new', 1)")
    _run(writer, schema, "UPDATE {t} SET note = 'changed' WHERE id IN (2, 50)")
    _run(writer, schema, "DELETE FROM {t} WHERE id IN (3, 60)")
    second = project.sync()
    assert f"{schema}.orders: incremental" in second.stderr, second.stderr
    assert _keys(dest_conn, schema) == [1, 2, 4, 5, 50, 1000]
    source = row_hashes(source_conn, schema, "orders")
    dest = row_hashes(dest_conn, schema, "orders")
    assert {k: source[k] for k in dest} == dest  # each row as the source has it


def test_skip_never_creates_or_reloads_a_missing_or_different_copy(
    project, schema, writer, dest_conn
):
    _create(writer, schema, "orders")
    _create(writer, schema, "items")
    dest_conn.execute(
        sql.SQL("CREATE TABLE {} (id bigint PRIMARY KEY, note text, amount numeric)").format(
            sql.Identifier(schema, "items")
        )
    )
    _config(project, schema, "orders", "items", skip=("orders", "items"))
    failed = project.run("sync")
    assert failed.exit_code == 1
    assert f"{schema}.orders: failed after" in failed.stderr
    assert (
        '"initial_load": "skip" with mode cdc adopts the destination table '
        f"{schema}.orders, which does not exist: create it with the source's columns, types "
        "and key"
    ) in failed.stderr, failed.stderr
    assert 'or remove "initial_load": "skip" to load the table in full' in failed.stderr
    assert (
        f"destination table {schema}.items, but it differs from the source (type changed: id "
        'integer -> bigint); make it match, or remove "initial_load": "skip" to load the table '
        "in full"
    ) in failed.stderr, failed.stderr
    assert not dest_conn.execute(
        "SELECT 1 FROM pg_tables WHERE schemaname = %s AND tablename = 'orders'", (schema,)
    ).fetchall()
    assert _keys(dest_conn, schema, "items") == []  # nothing loaded into the different one
    assert project.run("sync").exit_code == 1  # and not at the next run either


def _oid(conn, schema, table="orders"):
    query = "SELECT %s::regclass::oid"
    return conn.execute(query, (sql.Identifier(schema, table).as_string(conn),)).fetchone()[0]


def _change_while_the_slot_is_gone(writer, schema):
    """9 rows: 2 inserted, 3 updated, 4 deleted."""
    _run(writer, schema, "INSERT INTO {t} VALUES (1001, 'new', 1), (1002, 'new', 2)")
    _run(writer, schema, "UPDATE {t} SET note = 'changed' WHERE id IN (1, 2, 3)")
    _run(writer, schema, "DELETE FROM {t} WHERE id BETWEEN 10 AND 13")


def test_restart_repair_writes_exactly_the_rows_changed_while_the_slot_was_gone(
    project, schema, writer, source_conn, dest_conn
):
    _create(writer, schema, rows=100)
    _create(writer, schema, "items", rows=10)
    _config(project, schema, "orders", "items")
    project.sync()
    oid = _oid(dest_conn, schema)
    slot = slot_of(project)
    source_conn.execute("SELECT pg_drop_replication_slot(%s)", (slot,))
    _change_while_the_slot_is_gone(writer, schema)
    status = project.run("status")
    assert f"cdc: replication slot {slot} does not exist in the source" in status.output
    assert "fix: `replicator cdc restart --repair` starts a new slot and keeps the copies" in (
        status.output
    )

    restarted = project.run("cdc", "restart", "--repair")
    assert restarted.exit_code == 0, restarted.output
    assert (
        f"{schema}.orders: brought to the new slot's snapshot: 98 rows compared, 9 repaired "
        "(2 missing, 4 extra, 3 different)"
    ) in restarted.stdout, restarted.output
    assert f"{schema}.items: brought to the new slot's snapshot: 10 rows compared, 0 repaired" in (
        restarted.stdout
    )
    assert _oid(dest_conn, schema) == oid  # the copy was repaired in place, not replaced
    assert_same_table(source_conn, dest_conn, schema, "orders")
    assert source_conn.execute(
        "SELECT 1 FROM pg_replication_slots WHERE slot_name = %s", (slot,)
    ).fetchall()

    _run(writer, schema, "UPDATE {t} SET amount = 0 WHERE id IN (1, 50)")
    _run(writer, schema, "DELETE FROM {t} WHERE id = 1001")
    _run(writer, schema, "INSERT INTO {t} VALUES (10, 'back', 10)")
    after = project.sync()
    assert f"{schema}.orders: incremental" in after.stderr, after.stderr
    assert f"{schema}.items: noop" in after.stderr, after.stderr
    assert _oid(dest_conn, schema) == oid
    assert assert_same_table(source_conn, dest_conn, schema, "orders") == 98
    assert assert_same_table(source_conn, dest_conn, schema, "items") == 10


def test_restart_without_repair_reloads_at_the_next_sync(
    project, schema, writer, source_conn, dest_conn
):
    _create(writer, schema, rows=20)
    _config(project, schema, "orders")
    project.sync()
    slot = slot_of(project)
    source_conn.execute("SELECT pg_drop_replication_slot(%s)", (slot,))
    _change_while_the_slot_is_gone(writer, schema)
    restarted = project.run("cdc", "restart")
    assert restarted.exit_code == 0, restarted.output
    assert f"{schema}.orders: the next sync reloads it (refresh requested)" in restarted.stdout
    assert source_conn.execute(
        "SELECT 1 FROM pg_replication_slots WHERE slot_name = %s", (slot,)
    ).fetchall()
    status = json.loads(project.run("status", "--json").stdout)
    assert status[0]["next_action"].startswith("full_reload: refresh requested"), status
    synced = project.sync()
    assert f"{schema}.orders: full_reload" in synced.stderr
    assert "reason: refresh requested: cdc restart" in synced.stderr, synced.stderr
    _run(writer, schema, "UPDATE {t} SET note = 'later' WHERE id = 5")
    again = project.sync()
    assert f"{schema}.orders: incremental" in again.stderr, again.stderr
    assert assert_same_table(source_conn, dest_conn, schema, "orders") == 18


def test_restart_with_a_dba_slot_waits_for_the_dba_and_repairs_the_selected_copies(
    project, schema, writer, source_conn, dest_conn
):
    """A slot named in `cdc` with "create": false is the DBA's: restart never makes it; once
    it is back, the copies are brought to it (here -s repairs one, the other reloads)."""
    slot = f"dba_{uuid.uuid4().hex[:12]}"
    _create(writer, schema, "orders")
    _create(writer, schema, "items", rows=10)
    source_conn.execute(
        sql.SQL("CREATE PUBLICATION {} FOR TABLE {}, {}").format(
            sql.Identifier(slot), sql.Identifier(schema, "orders"), sql.Identifier(schema, "items")
        )
    )
    source_conn.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (slot,))
    try:
        tables = [{"name": f"{schema}.{t}", "mode": "cdc"} for t in ("orders", "items")]
        dba = {"slot": slot, "publication": slot, "create": False}
        project.write_config({"tables": tables, "cdc": dba})
        project.sync()
        source_conn.execute("SELECT pg_drop_replication_slot(%s)", (slot,))
        _change_while_the_slot_is_gone(writer, schema)
        _run(writer, schema, "UPDATE {t} SET note = 'gone too' WHERE id = 1", table="items")
        refused = project.run("cdc", "restart", "--repair")
        assert refused.exit_code == 1
        assert (
            f"replication slot {slot} (named in tables-config.json `cdc`) does not exist: it is "
            f"the DBA's, replicator never makes it: create it (SELECT "
            f"pg_create_logical_replication_slot('{slot}', 'pgoutput')), then run `replicator "
            "cdc restart` again"
        ) in refused.stderr, refused.stderr
        assert not source_conn.execute(
            "SELECT 1 FROM pg_replication_slots WHERE slot_name = %s", (slot,)
        ).fetchall()

        source_conn.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (slot,))
        _run(writer, schema, "UPDATE {t} SET amount = -1 WHERE id = 99")  # before the restart
        restarted = project.run("cdc", "restart", "--repair", "-s", f"{schema}.orders")
        assert restarted.exit_code == 0, restarted.output
        assert f"{schema}.orders: brought to the new slot's snapshot: 98 rows compared, 10 " in (
            restarted.stdout
        ), restarted.stdout
        assert f"{schema}.items: the next sync reloads it (refresh requested)" in restarted.stdout
        _run(writer, schema, "UPDATE {t} SET amount = -2 WHERE id = 98")  # after it
        synced = project.sync()
        assert f"{schema}.orders: incremental" in synced.stderr, synced.stderr
        assert f"{schema}.items: full_reload" in synced.stderr, synced.stderr
        assert assert_same_table(source_conn, dest_conn, schema, "orders") == 98
        assert assert_same_table(source_conn, dest_conn, schema, "items") == 10
    finally:
        source_conn.execute(
            "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots "
            "WHERE slot_name = %s",
            (slot,),
        )
        source_conn.execute(sql.SQL("DROP PUBLICATION IF EXISTS {}").format(sql.Identifier(slot)))
