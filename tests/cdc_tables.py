"""What the `cdc` tests share: the orders table they capture, the config that captures it,
statements on it, the project's slot, and a slot and publication made as a DBA makes them."""

from __future__ import annotations

import json
import uuid

from psycopg import sql


def create_orders(conn, schema, table="orders", rows=100):
    """`schema.table` with a key, text, a number and a column for big values, `rows` rows."""
    target = sql.Identifier(schema, table)
    conn.execute(
        sql.SQL("CREATE TABLE {} (id int PRIMARY KEY, note text, amount numeric, big text)").format(
            target
        )
    )
    conn.execute(
        sql.SQL(
            "INSERT INTO {} SELECT g, 'n' || g, g * 1.5, NULL FROM generate_series(1, %s) g"
        ).format(target),
        (rows,),
    )


def configure_cdc(project, schema, *tables, **top):
    """The tables of `schema` in `mode: "cdc"`; `top`: the config's other keys (`cdc`...)."""
    project.write_config(
        {"tables": [{"name": f"{schema}.{t}", "mode": "cdc"} for t in tables], **top}
    )


def on_table(conn, schema, statement, *params, table="orders"):
    """Run `statement` with `{t}` standing for `schema.table`."""
    conn.execute(sql.SQL(statement).format(t=sql.Identifier(schema, table)), params or None)


def published_tables(conn, project):
    """The tables the project's publication holds on the source, by name."""
    publication = json.loads((project.path / "sync-state" / "cdc.json").read_text())
    return conn.execute(
        "SELECT tablename FROM pg_publication_tables WHERE pubname = %s ORDER BY 1",
        (publication["publication"],),
    ).fetchall()


def slot_of(project):
    """The project's replication slot, as sync-state names it."""
    return json.loads((project.path / "sync-state" / "cdc.json").read_text())["slot"]


def dba_slot(source_conn, schema, name, *tables, plugin="pgoutput"):
    """A publication of `tables` and a slot, both called `name`, as a DBA makes them."""
    source_conn.execute(
        sql.SQL("CREATE PUBLICATION {} FOR TABLE {}").format(
            sql.Identifier(name), sql.SQL(", ").join(sql.Identifier(schema, t) for t in tables)
        )
    )
    source_conn.execute("SELECT pg_create_logical_replication_slot(%s, %s)", (name, plugin))


def drop_dba_slots(source_conn, *names):
    for name in names:
        source_conn.execute(
            "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots "
            "WHERE slot_name = %s",
            (name,),
        )
        source_conn.execute(sql.SQL("DROP PUBLICATION IF EXISTS {}").format(sql.Identifier(name)))


def big_text():
    """A value PostgreSQL stores out of line (TOASTed): incompressible, 19,200 characters."""
    return "".join(uuid.uuid4().hex for _ in range(600))
