"""`on_schema_change: "evolve"`: a source schema change taken by the copy in place
(plan/evolution.py, sync/incremental/evolve.py; for `cdc` tables at the change's place in the
log, test_cdc_evolution.py). The copy keeps its OID, its analyst's index and its views, and
is md5-exact after each change; rows are written only where the new column's value differs
from what the ALTER gave every row."""

from __future__ import annotations

import json

import pytest
from dbcompare import assert_same_table
from evolving_tables import Writer, create_orders, has_index, oid_of, on_orders, written
from psycopg import sql


def _evolving(project, schema):
    project.configure(schema, "orders", replication_key="updated_at", on_schema_change="evolve")
    project.sync()


@pytest.fixture
def evolving_orders(db_project, source_conn, schema):
    """The orders table, copied once under on_schema_change "evolve"."""
    create_orders(source_conn, schema)
    _evolving(db_project, schema)


def _last_reason(project, schema):
    status = json.loads(project.run("status", "--json").stdout)
    return next(r for r in status if r["name"] == f"{schema}.orders")["last_reason"]


def test_an_added_column_with_a_constant_default_writes_only_the_rows_that_differ(
    evolving_orders, db_project, source_conn, dest_conn, schema
):
    on_orders(
        dest_conn,
        schema,
        "CREATE INDEX by_n ON {t} (n); CREATE VIEW {s}.v AS SELECT id, n FROM {t}",
    )
    oid, before = oid_of(dest_conn, schema), written(dest_conn, schema)
    on_orders(source_conn, schema, "ALTER TABLE {t} ADD COLUMN region text NOT NULL DEFAULT 'eu'")
    # a backfill that moves no cursor, and a row changed as usual
    on_orders(source_conn, schema, "UPDATE {t} SET region = 'us' WHERE id <= 7")
    on_orders(source_conn, schema, "UPDATE {t} SET n = -1, updated_at = now() WHERE id = 100")

    synced = db_project.sync()

    assert f"{schema}.orders: schema evolved: column added: region text NOT NULL; 7 row(s)" in (
        synced.stderr
    ), synced.stderr
    assert oid_of(dest_conn, schema) == oid, "the copy kept its OID"
    assert_same_table(source_conn, dest_conn, schema, "orders")
    assert written(dest_conn, schema) - before <= 8, "the 7 backfilled rows and the changed one"
    assert dest_conn.execute(
        "SELECT attnotnull FROM pg_attribute WHERE attrelid = %s::regclass AND attname = 'region'",
        (f"{schema}.orders",),
    ).fetchone() == (True,)
    assert has_index(dest_conn, schema, "by_n")
    assert _last_reason(db_project, schema).startswith("schema evolved: column added: region")
    assert "evolved" not in db_project.sync().stderr, "once"


def test_a_backfill_of_a_third_of_the_rows_writes_them_and_builds_the_key_again(
    evolving_orders, db_project, source_conn, dest_conn, schema
):
    on_orders(source_conn, schema, "ALTER TABLE {t} ADD COLUMN token uuid")
    on_orders(source_conn, schema, "UPDATE {t} SET token = gen_random_uuid() WHERE id % 3 = 0")
    oid = oid_of(dest_conn, schema)
    synced = db_project.sync()
    assert "666 row(s) given the new columns' values" in synced.stderr, synced.stderr
    assert_same_table(source_conn, dest_conn, schema, "orders")
    assert oid_of(dest_conn, schema) == oid
    assert dest_conn.execute(  # the key, built again after the UPDATE, keeps its name
        "SELECT conname FROM pg_constraint WHERE conrelid = %s AND contype = 'p'", (oid,)
    ).fetchall() == [("orders_pkey",)]


def test_a_volatile_default_that_would_rewrite_every_row_reloads_instead(
    evolving_orders, db_project, source_conn, dest_conn, schema
):
    on_orders(dest_conn, schema, "CREATE INDEX by_n ON {t} (n)")
    on_orders(
        source_conn, schema, "ALTER TABLE {t} ADD COLUMN token uuid DEFAULT gen_random_uuid()"
    )
    synced = db_project.sync()
    assert (
        "schema changed: column added: token uuid (cannot evolve: more than 1,000 of about "
        "2,000 rows would get new values, which a reload writes sooner)"
    ) in synced.stderr, synced.stderr
    assert_same_table(source_conn, dest_conn, schema, "orders")
    assert has_index(dest_conn, schema, "by_n"), "kept by the reload"


# Widenings, a rename, NOT NULL and a drop, in an order each can follow the one before.
_RESHAPES = (
    "ALTER TABLE {t} ALTER COLUMN n TYPE bigint",
    "ALTER TABLE {t} ALTER COLUMN label TYPE varchar(40)",
    "ALTER TABLE {t} ALTER COLUMN amount TYPE numeric(12,2)",
    "ALTER TABLE {t} RENAME COLUMN amount TO price",
    "ALTER TABLE {t} ALTER COLUMN label SET NOT NULL",
    "ALTER TABLE {t} DROP COLUMN price",
)


def test_drops_renames_widenings_and_nullability_are_taken_in_place_with_the_views(
    evolving_orders, db_project, source_conn, dest_conn, schema
):
    on_orders(
        dest_conn,
        schema,
        "CREATE VIEW {s}.labels AS SELECT id, label, n FROM {t}; "
        "CREATE MATERIALIZED VIEW {s}.total AS SELECT sum(n) AS n FROM {t}",
    )
    oid = oid_of(dest_conn, schema)
    for change in _RESHAPES:
        on_orders(source_conn, schema, change)
        total = source_conn.execute(
            sql.SQL("SELECT sum(n) FROM {}").format(sql.Identifier(schema, "orders"))
        ).fetchone()
        on_orders(
            source_conn, schema, "UPDATE {t} SET n = n + 1, updated_at = now() WHERE id % 50 = 0"
        )
        synced = db_project.sync()
        assert "schema evolved: " in synced.stderr, (change, synced.stderr)
        assert oid_of(dest_conn, schema) == oid, change
        assert_same_table(source_conn, dest_conn, schema, "orders")
    # recreated and refreshed by the last ALTER (the drop), before the batch that followed
    assert (
        dest_conn.execute(
            sql.SQL("SELECT n FROM {}").format(sql.Identifier(schema, "total"))
        ).fetchone()
        == total
    )


def test_a_narrowing_cannot_evolve_and_reloads_with_the_reason(
    evolving_orders, db_project, source_conn, dest_conn, schema
):
    oid = oid_of(dest_conn, schema)
    on_orders(source_conn, schema, "ALTER TABLE {t} ALTER COLUMN n TYPE smallint")
    synced = db_project.sync()
    assert (
        "schema changed: type changed: n integer -> smallint (cannot evolve: n integer -> "
        "smallint is not a widening that keeps every value's text)"
    ) in synced.stderr, synced.stderr
    assert oid_of(dest_conn, schema) != oid
    assert_same_table(source_conn, dest_conn, schema, "orders")


def test_a_kill_inside_the_evolution_leaves_the_copy_as_it_was_and_the_next_run_converges(
    evolving_orders, db_project, source_conn, dest_conn, schema
):
    on_orders(source_conn, schema, "ALTER TABLE {t} ADD COLUMN region text DEFAULT 'eu'")
    on_orders(source_conn, schema, "UPDATE {t} SET region = 'us' WHERE id % 3 = 0")
    killed = db_project.run_process("sync", env={"REPLICATOR_FAILPOINT": "mid-evolve"})
    assert killed.returncode == -9, killed.stderr
    assert dest_conn.execute(
        "SELECT count(*) FROM pg_attribute WHERE attrelid = %s::regclass AND attname = 'region'",
        (f"{schema}.orders",),
    ).fetchone() == (0,), "rolled back"
    synced = db_project.sync()
    assert "666 row(s) given the new columns' values" in synced.stderr, synced.stderr
    assert_same_table(source_conn, dest_conn, schema, "orders")


def test_check_says_which_change_can_evolve(db_project, source_conn, schema):
    create_orders(source_conn, schema)
    db_project.configure(schema, "orders", replication_key="updated_at")
    db_project.sync()
    on_orders(source_conn, schema, "ALTER TABLE {t} ADD COLUMN region text")
    checked = db_project.run("check").stdout
    assert (
        f"ok    {schema}.orders: next sync: full_reload (schema changed: column added: region "
        in (checked)
    ), checked
    assert 'with "on_schema_change": "evolve" the copy would take this change in place' in checked
    _evolving_config = {"replication_key": "updated_at", "on_schema_change": "evolve"}
    db_project.configure(schema, "orders", **_evolving_config)
    checked = db_project.run("check").stdout
    assert (
        f"ok    {schema}.orders: next sync: incremental (schema evolved: column added: region text)"
        in checked
    ), checked


def test_a_partitioned_root_evolves(db_project, source_conn, dest_conn, schema):
    on_orders(
        source_conn,
        schema,
        "CREATE TABLE {t} (id int PRIMARY KEY, secret text, updated_at timestamptz NOT NULL) "
        "PARTITION BY RANGE (id); "
        "CREATE TABLE {s}.orders_a PARTITION OF {t} FOR VALUES FROM (0) TO (1000); "
        "CREATE TABLE {s}.orders_b PARTITION OF {t} FOR VALUES FROM (1000) TO (2000); "
        "INSERT INTO {t} SELECT g, 's', now() - interval '1 hour' FROM generate_series(1, 1999) g",
    )
    db_project.configure(
        schema,
        "orders",
        replication_key="updated_at",
        on_schema_change="evolve",
        columns={"exclude": ["secret"]},
    )
    db_project.sync()
    oid = oid_of(dest_conn, schema)
    on_orders(source_conn, schema, "ALTER TABLE {t} ADD COLUMN region text DEFAULT 'eu'")
    on_orders(source_conn, schema, "UPDATE {t} SET region = 'us' WHERE id > 1500")
    synced = db_project.sync()
    assert "schema evolved: column added: region text; 499 row(s)" in synced.stderr, synced.stderr
    assert oid_of(dest_conn, schema) == oid
    columns = dest_conn.execute(
        "SELECT attname FROM pg_attribute WHERE attrelid = %s::regclass AND attnum > 0 "
        "AND NOT attisdropped ORDER BY attnum",
        (f"{schema}.orders",),
    ).fetchall()
    assert columns == [("id",), ("updated_at",), ("region",)]
    same = sql.SQL("SELECT id, updated_at, region FROM {} ORDER BY id").format(
        sql.Identifier(schema, "orders")
    )
    assert dest_conn.execute(same).fetchall() == source_conn.execute(same).fetchall()


def test_a_column_added_outside_the_included_ones_changes_nothing(
    db_project, source_conn, dest_conn, schema
):
    create_orders(source_conn, schema)
    db_project.configure(
        schema,
        "orders",
        replication_key="updated_at",
        on_schema_change="evolve",
        columns={"include": ["id", "n", "updated_at"]},
    )
    db_project.sync()
    oid = oid_of(dest_conn, schema)
    on_orders(source_conn, schema, "ALTER TABLE {t} ADD COLUMN pin text DEFAULT '1234'")
    synced = db_project.sync()
    assert "schema" not in synced.stderr and oid_of(dest_conn, schema) == oid, synced.stderr


# Each kind of change the copy takes in place, with the statements that follow it.
_CHANGES = [
    "ALTER TABLE {t} ADD COLUMN region text NOT NULL DEFAULT 'eu'; "
    "UPDATE {t} SET region = 'us' WHERE id <= 7",  # a backfill that moves no updated_at
    "ALTER TABLE {t} ADD COLUMN token uuid; "
    "UPDATE {t} SET token = gen_random_uuid() WHERE id % 3 = 0",
    *_RESHAPES,
]


@pytest.mark.parametrize("mode", ["incremental", "cdc"])
def test_every_change_with_a_writer_running_through_it(
    cdc_project, pg_servers, writer, dest_conn, schema, mode
):
    """A writer inserts and updates (and in cdc deletes) all along: before, during and after
    each ALTER, and while the sync that takes it runs. Once it pauses, one more sync makes
    the copy md5-exact; its OID, an analyst's index and a view on it stay."""
    create_orders(writer, schema)
    entry = {"mode": "cdc"} if mode == "cdc" else {"replication_key": "updated_at"}
    cdc_project.configure(schema, "orders", on_schema_change="evolve", **entry)
    cdc_project.sync()
    on_orders(dest_conn, schema, "CREATE INDEX by_n ON {t} (n)")
    on_orders(dest_conn, schema, "CREATE VIEW {s}.recent AS SELECT id, n, updated_at FROM {t}")
    # retyped columns under a materialized view: it is dropped and made again around the ALTER
    on_orders(
        dest_conn, schema, "CREATE MATERIALIZED VIEW {s}.shown AS SELECT id, n, label FROM {t}"
    )
    oid = oid_of(dest_conn, schema)
    running = Writer(pg_servers.source_url, schema, deletes=mode == "cdc")
    try:
        for change in _CHANGES:
            running.wrote()
            on_orders(writer, schema, change)
            running.wrote()
            synced = cdc_project.sync()
            assert "schema evolved: " in synced.stderr, (change, synced.stderr)
            running.pause()
            cdc_project.sync()
            assert_same_table(writer, dest_conn, schema, "orders")
            assert oid_of(dest_conn, schema) == oid, change
            running.resume()
    finally:
        running.close()
    assert has_index(dest_conn, schema, "by_n")
    count = sql.SQL("SELECT count(*) FROM {}")
    assert dest_conn.execute(count.format(sql.Identifier(schema, "recent"))).fetchone() == (
        writer.execute(count.format(sql.Identifier(schema, "orders"))).fetchone()
    )


def test_a_column_of_a_user_defined_type_is_added_with_its_type(
    evolving_orders, db_project, source_conn, dest_conn, schema
):
    on_orders(source_conn, schema, "CREATE TYPE {s}.status AS ENUM ('new', 'paid')")
    on_orders(
        source_conn, schema, "ALTER TABLE {t} ADD COLUMN status {s}.status NOT NULL DEFAULT 'new'"
    )
    on_orders(source_conn, schema, "UPDATE {t} SET status = 'paid' WHERE id <= 3")
    oid = oid_of(dest_conn, schema)
    synced = db_project.sync()
    assert f"schema evolved: column added: status {schema}.status NOT NULL; 3 row(s)" in (
        synced.stderr
    ), synced.stderr
    assert oid_of(dest_conn, schema) == oid
    assert_same_table(source_conn, dest_conn, schema, "orders")


def test_a_model_s_own_columns_decide(db_project, source_conn, dest_conn, schema):
    """The model reads every column and adds one of its own: a column added upstream is
    one the model returns too, brought to its values by the model's SELECT."""
    create_orders(source_conn, schema)
    (db_project.path / "models" / schema).mkdir(parents=True)
    (db_project.path / "models" / schema / "orders.sql").write_text(
        f"SELECT *, n * 2 AS twice FROM {schema}.orders"
    )
    _evolving(db_project, schema)
    oid = oid_of(dest_conn, schema)
    on_orders(source_conn, schema, "ALTER TABLE {t} ADD COLUMN region text DEFAULT 'eu'")
    on_orders(source_conn, schema, "UPDATE {t} SET region = 'us' WHERE id <= 4")
    synced = db_project.sync()
    assert "schema evolved: column added: region text; 4 row(s)" in synced.stderr, synced.stderr
    assert oid_of(dest_conn, schema) == oid
    model = sql.SQL("SELECT *, n * 2 AS twice FROM {} ORDER BY id").format(
        sql.Identifier(schema, "orders")
    )
    copy = sql.SQL("SELECT id, n, label, amount, updated_at, region, twice FROM {} ORDER BY id")
    assert dest_conn.execute(copy.format(sql.Identifier(schema, "orders"))).fetchall() == (
        source_conn.execute(model).fetchall()
    )
