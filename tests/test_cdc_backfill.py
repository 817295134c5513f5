"""Backfills the user chooses for `mode: "cdc"`: a copy adopted without one
(`initial_load: "skip"`), and `cdc restart` after a lost or dropped slot, which repairs the
copies to the new slot instead of reloading them. Against real servers, without Spark."""

from __future__ import annotations

import json

import pytest
from dbcompare import row_hashes
from psycopg import sql

IN_PROCESS = {"REPLICATOR_SPARK_MIN_ROWS": "1000000000"}  # small tables: no JVM


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


def _sync(project, *args):
    result = project.run("sync", *args)
    assert result.exit_code == 0, result.output
    return result


def _slot(project):
    return json.loads((project.path / "sync-state" / "cdc.json").read_text())["slot"]


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
    first = _sync(project)
    assert "reason: no state: initial_load skip: destination table adopted, applies the log" in (
        first.stderr
    ), first.stderr
    assert _keys(dest_conn, schema) == [1, 2, 3, 4, 5]  # the 95 others were never copied

    _run(writer, schema, "INSERT INTO {t} VALUES (1000, 'new', 1)")
    _run(writer, schema, "UPDATE {t} SET note = 'changed' WHERE id IN (2, 50)")
    _run(writer, schema, "DELETE FROM {t} WHERE id IN (3, 60)")
    second = _sync(project)
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
