"""`on_schema_change: "evolve"` for `cdc` tables: the copy takes a source schema change in
place at the change's place in the log (sync/cdc/log_evolution.py). Changes before it are
applied with the old columns and changes after it with the new; the added columns' old
rows are brought to the source's values; the copy keeps its OID and is md5-exact."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from dbcompare import assert_same_table
from evolving_tables import create_orders, has_index, oid_of, on_orders, written
from psycopg import sql
from waiting import wait_for


def _captured(project, source_conn, schema, rows=2000):
    create_orders(source_conn, schema, rows)
    project.configure(schema, "orders", mode="cdc", on_schema_change="evolve")
    project.sync()


def _sync_with_changes_before_its_drain(project, tmp_path, changes):
    """A sync, as its own process, held after its plan and before its drain's end is taken
    while `changes` runs: what they commit is in the drain, and the plan did not see it.
    Returns its log; it must succeed."""
    pause = tmp_path / "pause"
    syncing = subprocess.Popen(
        [sys.executable, "-m", "replicator", "sync", "--project-dir", str(project.path)],
        env={**os.environ, **project.env, "REPLICATOR_PAUSE_AT": f"cdc-before-upto={pause}"},
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    wait_for(lambda: (tmp_path / "pause.reached").exists(), 120, "the sync before its drain")
    changes()
    pause.touch()
    _, err = syncing.communicate(timeout=120)
    assert syncing.returncode == 0, err
    return err


def test_a_column_added_with_no_change_after_it_is_taken_at_the_end_of_the_drain(
    cdc_project, writer, dest_conn, schema
):
    _captured(cdc_project, writer, schema)
    oid = oid_of(dest_conn, schema)
    on_orders(writer, schema, "UPDATE {t} SET n = -n WHERE id <= 5")  # before: old columns
    on_orders(writer, schema, "ALTER TABLE {t} ADD COLUMN region text DEFAULT 'eu'")
    before = written(dest_conn, schema)
    synced = cdc_project.sync()
    assert f"{schema}.orders: schema evolved: column added: region text; 0 row(s)" in (
        synced.stderr
    ), synced.stderr
    assert oid_of(dest_conn, schema) == oid
    assert_same_table(writer, dest_conn, schema, "orders")
    assert written(dest_conn, schema) - before <= 5
    assert "evolved" not in cdc_project.sync().stderr, "once"


def test_changes_before_the_alter_take_the_old_columns_and_after_it_the_new(
    cdc_project, writer, dest_conn, schema
):
    _captured(cdc_project, writer, schema)
    on_orders(dest_conn, schema, "CREATE INDEX by_n ON {t} (n)")
    on_orders(dest_conn, schema, "CREATE VIEW {s}.v AS SELECT id, n FROM {t}")
    oid = oid_of(dest_conn, schema)
    on_orders(writer, schema, "UPDATE {t} SET n = -n WHERE id <= 5")
    on_orders(writer, schema, "INSERT INTO {t} (id, n) VALUES (5001, 1)")
    on_orders(writer, schema, "ALTER TABLE {t} ADD COLUMN region text NOT NULL DEFAULT 'eu'")
    on_orders(writer, schema, "UPDATE {t} SET region = 'us' WHERE id <= 7")
    on_orders(writer, schema, "INSERT INTO {t} (id, n, region) VALUES (5002, 2, 'ca')")
    on_orders(writer, schema, "DELETE FROM {t} WHERE id = 9")
    synced = cdc_project.sync()
    assert f"{schema}.orders: schema evolved: column added: region text NOT NULL" in (
        synced.stderr
    ), synced.stderr
    assert oid_of(dest_conn, schema) == oid
    assert has_index(dest_conn, schema, "by_n")
    assert_same_table(writer, dest_conn, schema, "orders")


def test_a_change_committed_while_the_run_planned_is_taken_at_its_relation_message(
    cdc_project, writer, dest_conn, schema, tmp_path
):
    """The run's plan saw no change: the drain meets it in the log, and stops the table
    there; the ALTER and its backfill are taken, then the table drained again."""
    _captured(cdc_project, writer, schema)
    on_orders(writer, schema, "UPDATE {t} SET n = -n WHERE id <= 5")

    def migration():
        # a migration: new columns, their values, rows it leaves out, then NOT NULL
        on_orders(writer, schema, "ALTER TABLE {t} ADD COLUMN token uuid, ALTER n TYPE bigint")
        on_orders(writer, schema, "UPDATE {t} SET token = gen_random_uuid() WHERE id <= 900")
        on_orders(writer, schema, "DELETE FROM {t} WHERE id > 900")
        on_orders(writer, schema, "ALTER TABLE {t} ALTER COLUMN token SET NOT NULL")
        on_orders(writer, schema, "UPDATE {t} SET n = n + 5000000000 WHERE id = 8")

    err = _sync_with_changes_before_its_drain(cdc_project, tmp_path, migration)
    assert "orders: schema evolved: " in err and "900 row(s) given" in err, err
    assert "column added: token uuid NOT NULL" in err, err
    assert_same_table(writer, dest_conn, schema, "orders")
    assert dest_conn.execute(
        "SELECT attnotnull FROM pg_attribute WHERE attrelid = %s::regclass AND attname = 'token'",
        (f"{schema}.orders",),
    ).fetchone() == (True,)


def test_a_kill_inside_the_evolution_leaves_the_copy_as_it_was_and_the_next_run_converges(
    cdc_project, writer, dest_conn, schema
):
    _captured(cdc_project, writer, schema)
    on_orders(writer, schema, "ALTER TABLE {t} ADD COLUMN region text DEFAULT 'eu'")
    on_orders(writer, schema, "UPDATE {t} SET region = 'us' WHERE id % 3 = 0")
    on_orders(writer, schema, "UPDATE {t} SET n = 0 WHERE id = 1")
    killed = cdc_project.run_process("sync", env={"REPLICATOR_FAILPOINT": "mid-evolve"})
    assert killed.returncode == -9, killed.stderr
    assert dest_conn.execute(
        "SELECT count(*) FROM pg_attribute WHERE attrelid = %s::regclass AND attname = 'region'",
        (f"{schema}.orders",),
    ).fetchone() == (0,), "rolled back"
    on_orders(writer, schema, "UPDATE {t} SET region = 'ca' WHERE id = 2")
    synced = cdc_project.sync()
    assert "schema evolved: column added: region text; 667 row(s)" in synced.stderr, synced.stderr
    assert_same_table(writer, dest_conn, schema, "orders")


@pytest.mark.parametrize(
    ("statements", "reason"),
    [
        (
            ["ALTER TABLE {t} ALTER COLUMN n TYPE smallint", "UPDATE {t} SET n = 1 WHERE id = 1"],
            "schema changed: type changed: n integer -> smallint (cannot evolve: n integer -> "
            "smallint is not a widening that keeps every value's text)",
        ),
        (
            ["ALTER TABLE {t} ADD COLUMN token uuid DEFAULT gen_random_uuid()"],
            "schema changed: column added: token uuid (cannot evolve: more than 1,000 of about "
            "2,000 rows would get new values, which a reload writes sooner)",
        ),
        (
            [
                "BEGIN; UPDATE {t} SET n = 0 WHERE id = 1; ALTER TABLE {t} ADD COLUMN r text; "
                "UPDATE {t} SET r = 'x' WHERE id = 2; COMMIT"
            ],
            "schema changed: in the log: the shape changed inside a transaction that changed rows",
        ),
    ],
    ids=["narrowing", "volatile-default", "inside-a-transaction"],
)
def test_a_change_that_cannot_evolve_reloads_with_the_reason(
    cdc_project, writer, dest_conn, schema, statements, reason, tmp_path
):
    _captured(cdc_project, writer, schema)
    if "BEGIN" in statements[0]:  # committed after the plan, so that only the log shows it
        err = _sync_with_changes_before_its_drain(
            cdc_project, tmp_path, lambda: on_orders(writer, schema, statements[0])
        )
    else:
        for statement in statements:
            on_orders(writer, schema, statement)
        err = cdc_project.sync().stderr
    assert reason in err, err
    assert_same_table(writer, dest_conn, schema, "orders")


def test_a_partitioned_root_evolves(cdc_project, writer, dest_conn, schema):
    on_orders(
        writer,
        schema,
        "CREATE TABLE {t} (id int PRIMARY KEY, note text) PARTITION BY RANGE (id); "
        "CREATE TABLE {s}.orders_a PARTITION OF {t} FOR VALUES FROM (0) TO (1000); "
        "CREATE TABLE {s}.orders_b PARTITION OF {t} FOR VALUES FROM (1000) TO (2000); "
        "INSERT INTO {t} SELECT g, 'n' FROM generate_series(1, 1999) g",
    )
    cdc_project.configure(schema, "orders", mode="cdc", on_schema_change="evolve")
    cdc_project.sync()
    oid = oid_of(dest_conn, schema)
    on_orders(writer, schema, "UPDATE {t} SET note = 'before' WHERE id IN (1, 1001)")
    on_orders(writer, schema, "ALTER TABLE {t} ADD COLUMN region text DEFAULT 'eu'")
    on_orders(writer, schema, "UPDATE {t} SET region = 'us' WHERE id > 1500")
    synced = cdc_project.sync()
    assert "schema evolved: column added: region text; 499 row(s)" in synced.stderr, synced.stderr
    assert oid_of(dest_conn, schema) == oid
    same = sql.SQL("SELECT id, note, region FROM {} ORDER BY id").format(
        sql.Identifier(schema, "orders")
    )
    assert dest_conn.execute(same).fetchall() == writer.execute(same).fetchall()


def test_check_and_compile_show_the_change_the_log_will_take(cdc_project, writer, schema):
    create_orders(writer, schema)
    cdc_project.configure(schema, "orders", mode="cdc")
    cdc_project.sync()
    on_orders(writer, schema, "ALTER TABLE {t} ADD COLUMN region text NOT NULL DEFAULT 'eu'")
    checked = cdc_project.run("check").stdout
    assert 'with "on_schema_change": "evolve" the copy would take this change in place' in (
        checked
    ), checked
    cdc_project.configure(schema, "orders", mode="cdc", on_schema_change="evolve")
    checked = cdc_project.run("check").stdout
    assert (
        f"ok    {schema}.orders: next sync: incremental (schema evolved: column added: region "
        "text NOT NULL)"
    ) in checked, checked
    compiled = cdc_project.run("compile").stdout
    evolution = compiled.split("-- cdc schema evolution:")[1]
    assert "ADD COLUMN \"region\" text DEFAULT CAST('eu' AS text)" in evolution, evolution
    assert evolution.rstrip().endswith('ALTER COLUMN "region" SET NOT NULL;'), evolution


def test_a_column_of_a_user_defined_type_is_added_at_its_place_in_the_log(
    cdc_project, writer, dest_conn, schema
):
    _captured(cdc_project, writer, schema)
    on_orders(writer, schema, "CREATE TYPE {s}.status AS ENUM ('new', 'paid')")
    on_orders(writer, schema, "ALTER TABLE {t} ADD COLUMN status {s}.status DEFAULT 'new'")
    on_orders(writer, schema, "UPDATE {t} SET status = 'paid' WHERE id <= 3")
    synced = cdc_project.sync()
    assert f"schema evolved: column added: status {schema}.status; 3 row(s)" in synced.stderr, (
        synced.stderr
    )
    on_orders(writer, schema, "UPDATE {t} SET status = 'paid' WHERE id = 10")
    assert "schema" not in cdc_project.sync().stderr
    assert_same_table(writer, dest_conn, schema, "orders")
