"""A loading role with the least privilege a sync needs, and the views other roles build on
replicated tables: schemas are created only when missing, and a reload that cannot carry a
dependent view across fails before it copies anything, naming the view, its owner and the
privilege, as `check` does up front."""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psycopg
import pytest
from dbcompare import assert_same_table
from psycopg import sql

pytestmark = pytest.mark.spark


@dataclass(frozen=True)
class Warehouse:
    """A destination database of the test's own, and a login role `loader` in it that may
    not create schemas (no CREATE on the database), only use the ones it was given."""

    admin_url: str  # as the superuser
    loader_url: str
    loader: str
    database: str


def _with(url: str, database: str, user: str) -> str:
    return re.sub(r"//[^@]+@", f"//{user}@", url).rsplit("/", 1)[0] + f"/{database}"


@pytest.fixture
def warehouse(pg_servers, dest_conn) -> Iterator[Warehouse]:
    suffix = uuid.uuid4().hex[:8]
    database, loader = f"wh_{suffix}", f"loader_{suffix}"
    dest_conn.execute(sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(loader)))
    dest_conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(database)))
    try:
        yield Warehouse(
            _with(pg_servers.dest_url, database, "postgres"),
            _with(pg_servers.dest_url, database, loader),
            loader,
            database,
        )
    finally:
        dest_conn.execute(sql.SQL("DROP DATABASE {} WITH (FORCE)").format(sql.Identifier(database)))
        dest_conn.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(loader)))


@pytest.fixture
def orders(source_conn, schema) -> str:
    table = sql.Identifier(schema, "orders")
    source_conn.execute(
        sql.SQL(
            "CREATE TABLE {} (id int PRIMARY KEY, amount numeric(10,2), "
            "updated_at timestamptz NOT NULL DEFAULT now())"
        ).format(table)
    )
    source_conn.execute(
        sql.SQL(
            "INSERT INTO {} (id, amount) SELECT g, g * 1.5 FROM generate_series(1, 200) g"
        ).format(table)
    )
    return schema


def _admin(warehouse: Warehouse, statements: list[sql.Composable]) -> None:
    with psycopg.connect(warehouse.admin_url, autocommit=True) as conn:
        for statement in statements:
            conn.execute(statement)


def _owned_schemas(warehouse: Warehouse, *schemas: str) -> None:
    _admin(
        warehouse,
        [
            sql.SQL("CREATE SCHEMA {} AUTHORIZATION {}").format(
                sql.Identifier(s), sql.Identifier(warehouse.loader)
            )
            for s in schemas
        ],
    )


def test_pre_created_schemas_are_enough_no_create_on_the_database(
    db_project, warehouse, orders, source_conn
):
    _owned_schemas(warehouse, "_replicator", orders)
    db_project.env["REPLICATOR_DEST_URL"] = warehouse.loader_url
    db_project.write_config(
        {"tables": [{"name": f"{orders}.orders", "replication_key": "updated_at"}]}
    )
    checked = db_project.run("check")
    assert checked.exit_code == 0, checked.stdout
    assert "CREATE ON DATABASE" not in checked.stdout
    assert f"ok    destination: role {warehouse.loader} may create tables in schemas" in (
        checked.stdout
    )
    for args in (("sync",), ("sync", "-f"), ("sync",)):
        synced = db_project.run(*args)
        assert synced.exit_code == 0, synced.output
    source_conn.execute(
        sql.SQL(
            "UPDATE {} SET amount = 0, updated_at = now() + interval '1 min' WHERE id < 9"
        ).format(sql.Identifier(orders, "orders"))
    )
    assert db_project.run("sync").exit_code == 0
    with psycopg.connect(warehouse.admin_url) as dest:
        assert_same_table(source_conn, dest, orders, "orders")


def test_a_missing_schema_asks_for_create_on_the_database_by_name(db_project, warehouse, orders):
    _owned_schemas(warehouse, "_replicator")
    db_project.env["REPLICATOR_DEST_URL"] = warehouse.loader_url
    db_project.write_config({"tables": [{"name": f"{orders}.orders", "mode": "full-refresh"}]})
    checked = db_project.run("check")
    assert checked.exit_code == 1
    assert (
        f"error destination: schema {orders} does not exist and role {warehouse.loader} may "
        f"not create schemas in database {warehouse.database}; fix: CREATE SCHEMA {orders} "
        f"AUTHORIZATION {warehouse.loader}, or GRANT CREATE ON DATABASE {warehouse.database} "
        f"TO {warehouse.loader}" in checked.stdout
    ), checked.stdout
    assert "<db>" not in checked.stdout


def test_a_view_another_role_owns_is_named_with_the_privilege_the_reload_lacks(
    db_project, warehouse, orders, source_conn
):
    """An analyst's view in their own schema on a replicated table: the loading role cannot
    recreate it. The reload fails before it copies a row, naming view, owner, privileges and
    the GRANTs; `check` says the same up front; with the grants given, it goes through."""
    _owned_schemas(warehouse, "_replicator", orders)
    analyst = f"analyst_{warehouse.loader}"
    db_project.env["REPLICATOR_DEST_URL"] = warehouse.loader_url
    db_project.write_config({"tables": [{"name": f"{orders}.orders", "mode": "full-refresh"}]})
    assert db_project.run("sync").exit_code == 0
    table = sql.Identifier(orders, "orders")
    _admin(
        warehouse,
        [
            sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(analyst)),
            sql.SQL("CREATE SCHEMA analytics AUTHORIZATION {}").format(sql.Identifier(analyst)),
            sql.SQL("GRANT USAGE ON SCHEMA {} TO {}").format(
                sql.Identifier(orders), sql.Identifier(analyst)
            ),
            sql.SQL("SET ROLE {}").format(sql.Identifier(warehouse.loader)),
            sql.SQL("GRANT SELECT ON {} TO {}").format(table, sql.Identifier(analyst)),
            sql.SQL("SET ROLE {}").format(sql.Identifier(analyst)),
            sql.SQL(
                "CREATE VIEW analytics.big_orders AS SELECT * FROM {} WHERE amount > 100"
            ).format(table),
            sql.SQL("RESET ROLE"),
        ],
    )
    try:
        expected = (
            f"view analytics.big_orders (owner {analyst}) depends on {orders}.orders: a "
            f"reload recreates it, which role {warehouse.loader} cannot do: it lacks USAGE on "
            f"schema analytics, CREATE on schema analytics, membership in role {analyst}"
        )
        grants = (
            f"GRANT USAGE, CREATE ON SCHEMA analytics TO {warehouse.loader}; "
            f"GRANT {analyst} TO {warehouse.loader}"
        )
        checked = db_project.run("check")
        assert checked.exit_code == 1
        assert expected in checked.stdout and grants in checked.stdout, checked.stdout
        synced = db_project.run("sync", "-v")
        assert synced.exit_code == 1
        assert expected in synced.stderr and grants in synced.stderr, synced.stderr
        assert "copied" not in synced.stderr, "it failed before copying anything"
        _admin(
            warehouse,
            [
                sql.SQL("GRANT USAGE, CREATE ON SCHEMA analytics TO {}").format(
                    sql.Identifier(warehouse.loader)
                ),
                sql.SQL("GRANT {} TO {}").format(
                    sql.Identifier(analyst), sql.Identifier(warehouse.loader)
                ),
            ],
        )
        assert db_project.run("check").exit_code == 0
        again = db_project.run("sync")
        assert again.exit_code == 0, again.output
        with psycopg.connect(warehouse.admin_url, autocommit=True) as dest:
            owner, rows = dest.execute(
                "SELECT pg_get_userbyid(c.relowner), (SELECT count(*) FROM analytics.big_orders)"
                " FROM pg_class c WHERE c.oid = 'analytics.big_orders'::regclass"
            ).fetchone()
            assert (owner, rows) == (analyst, 134)
    finally:
        _admin(
            warehouse,
            [
                sql.SQL("DROP SCHEMA analytics CASCADE"),
                sql.SQL("DROP OWNED BY {}").format(sql.Identifier(analyst)),
                sql.SQL("DROP ROLE {}").format(sql.Identifier(analyst)),
            ],
        )


def test_a_view_a_superuser_owns_never_asks_for_superuser_membership(
    db_project, warehouse, orders, source_conn
):
    """A DBA's view (owned by `postgres`) on a replicated table: membership in its owner's
    role would make the loading role a superuser. The fix given hands the view over
    instead (or drops it), and says why; applied, the reload carries the view across."""
    _owned_schemas(warehouse, "_replicator", orders)
    db_project.env["REPLICATOR_DEST_URL"] = warehouse.loader_url
    db_project.write_config({"tables": [{"name": f"{orders}.orders", "mode": "full-refresh"}]})
    assert db_project.run("sync").exit_code == 0
    table = sql.Identifier(orders, "orders")
    _admin(
        warehouse,
        [
            sql.SQL("CREATE SCHEMA analytics"),
            sql.SQL(
                "CREATE VIEW analytics.big_orders AS SELECT * FROM {} WHERE amount > 100"
            ).format(table),
        ],
    )
    checked = db_project.run("check")
    synced = db_project.run("sync")
    assert (checked.exit_code, synced.exit_code) == (1, 1)
    for output in (checked.stdout, synced.stderr):
        assert "GRANT postgres TO" not in output, output
        assert "postgres is a superuser role, and membership in it would make" in output, output
        assert f"ALTER VIEW analytics.big_orders OWNER TO {warehouse.loader}" in output
        assert "or drop the views before the reload" in output
    _admin(
        warehouse,
        [
            sql.SQL("ALTER VIEW analytics.big_orders OWNER TO {}").format(
                sql.Identifier(warehouse.loader)
            ),
            sql.SQL("GRANT USAGE, CREATE ON SCHEMA analytics TO {}").format(
                sql.Identifier(warehouse.loader)
            ),
        ],
    )
    again = db_project.run("sync")
    assert again.exit_code == 0, again.output
    with psycopg.connect(warehouse.admin_url, autocommit=True) as dest:
        (rows,) = dest.execute("SELECT count(*) FROM analytics.big_orders").fetchone()
        assert rows == 134


def test_an_extension_the_role_may_not_create_is_named_with_the_statement(
    db_project, warehouse, source_conn, schema
):
    """A citext column, and a loading role without CREATE on the database: `check` and the
    sync name the column's type, the extension and the statement for a DBA, before anything
    is copied; once the role may create it (citext is trusted), the sync creates it."""
    if not Path("/usr/share/postgresql/15/extension/citext.control").exists():
        pytest.skip("citext is not installed with this PostgreSQL (the contrib modules)")
    s = sql.Identifier(schema)
    for statement in (
        "CREATE EXTENSION citext SCHEMA {s}",
        "CREATE TABLE {s}.people (id int PRIMARY KEY, name {s}.citext)",
        "INSERT INTO {s}.people SELECT g, 'Name ' || g FROM generate_series(1, 20) g",
    ):
        source_conn.execute(sql.SQL(statement).format(s=s))
    _owned_schemas(warehouse, "_replicator", schema)
    db_project.env["REPLICATOR_DEST_URL"] = warehouse.loader_url
    db_project.write_config({"tables": [{"name": f"{schema}.people", "mode": "full-refresh"}]})
    loader, database = warehouse.loader, warehouse.database
    expected = (
        f"column name uses type {schema}.citext of extension citext, which the destination "
        f"lacks; role {loader} may not create extension citext (a trusted extension: it needs "
        f"CREATE on database {database}); fix: CREATE EXTENSION IF NOT EXISTS citext SCHEMA "
        f"{schema} (as a superuser or the database owner), or GRANT CREATE ON DATABASE "
        f"{database} TO {loader}"
    )
    checked = db_project.run("check")
    assert checked.exit_code == 1
    assert f"error {schema}.people: {expected}" in checked.stdout, checked.stdout
    synced = db_project.run("sync", "-v")
    assert synced.exit_code == 1
    assert f"{schema}.people: failed after" in synced.stderr and expected in synced.stderr, (
        synced.stderr
    )
    assert "copied" not in synced.stderr, "it failed before copying anything"
    with psycopg.connect(warehouse.admin_url) as dest:
        (table,) = dest.execute(
            "SELECT to_regclass(%s)", (sql.Identifier(schema, "people").as_string(dest),)
        ).fetchone()
        assert table is None
    _admin(
        warehouse,
        [
            sql.SQL("GRANT CREATE ON DATABASE {} TO {}").format(
                sql.Identifier(database), sql.Identifier(loader)
            )
        ],
    )
    checked = db_project.run("check")
    assert checked.exit_code == 0, checked.stdout
    assert f"ok    {schema}.people: extension citext will be created by the first sync" in (
        checked.stdout
    )
    synced = db_project.run("sync")
    assert synced.exit_code == 0, synced.output
    with psycopg.connect(warehouse.admin_url) as dest:
        assert assert_same_table(source_conn, dest, schema, "people") == 20
