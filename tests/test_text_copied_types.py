"""Types whose values COPY's binary form cannot carry to another database travel in its text
form: the object identifier types (regclass, regtype, ...), whose binary form is the object's
OID, which in the destination names another object or none; and tsquery, int2vector and
oidvector (their binary input refuses the empty value) and aclitem (no binary form)."""

from __future__ import annotations

from urllib.parse import quote

import pytest
from dbcompare import assert_same_table
from engines import IN_PROCESS
from psycopg import sql

_VALUES = "SELECT id, rc::text, rt::text, rn::text, rp::text, rcs::text FROM {} ORDER BY id"


@pytest.mark.parametrize("mode", ["incremental", "cdc"])
def test_object_ids_name_the_same_objects_in_the_destination(
    db_project, source_conn, dest_conn, schema, mode
):
    """The objects are the schema, a type and a table the destination also has (under other
    OIDs there): a full load, then a batch or the log, copy their names."""
    s = sql.Identifier(schema)
    for statement in (
        "CREATE TYPE {s}.mood AS ENUM ('calm', 'busy')",
        "CREATE TABLE {s}.other (id int PRIMARY KEY, updated_at timestamptz NOT NULL)",
        "INSERT INTO {s}.other VALUES (1, now())",
        "CREATE TABLE {s}.refs (id int PRIMARY KEY, m {s}.mood, rc regclass, rt regtype, "
        "rn regnamespace, rp regproc, rcs regclass[], updated_at timestamptz NOT NULL)",
    ):
        source_conn.execute(sql.SQL(statement).format(s=s))
    row = (
        "INSERT INTO {s}.refs VALUES (%s, 'calm', {other}, {mood}, {schema}, 'now', "
        "ARRAY[{other}, 'pg_catalog.pg_class']::regclass[], now())"
    )
    values = {
        "s": s,
        "other": sql.Literal(f"{schema}.other"),
        "mood": sql.Literal(f"{schema}.mood"),
        "schema": sql.Literal(schema),
    }
    source_conn.execute(sql.SQL(row).format(**values), (1,))
    key = {"replication_key": "updated_at"} if mode == "incremental" else {"mode": "cdc"}
    tables = [{"name": f"{schema}.other", **key}, {"name": f"{schema}.refs", **key}]
    db_project.write_config({"tables": tables})
    table = sql.Identifier(schema, "refs")
    first = db_project.run("sync", env=IN_PROCESS)
    assert first.exit_code == 0, first.output
    source_conn.execute(sql.SQL(row).format(**values), (2,))
    later = db_project.run("sync", env=IN_PROCESS)
    assert later.exit_code == 0, later.output
    wanted = source_conn.execute(sql.SQL(_VALUES).format(table)).fetchall()
    assert wanted[0][1:] == (
        f"{schema}.other",
        f"{schema}.mood",
        schema,
        "now",
        f"{{{schema}.other,pg_class}}",
    )
    assert dest_conn.execute(sql.SQL(_VALUES).format(table)).fetchall() == wanted
    assert_same_table(source_conn, dest_conn, schema, "refs")


def test_values_binary_copy_cannot_read_back_are_copied(db_project, source_conn, dest_conn, schema):
    """An empty tsquery, int2vector and oidvector, and an aclitem: a full load, then a batch."""
    s = sql.Identifier(schema)
    source_conn.execute(
        sql.SQL(
            "CREATE TABLE {}.odd (id int PRIMARY KEY, q tsquery, qs tsquery[], i int2vector, "
            "o oidvector, a aclitem, acl aclitem[], updated_at timestamptz NOT NULL)"
        ).format(s)
    )
    row = (
        "INSERT INTO {}.odd VALUES (%s, '', ARRAY['', 'a & b']::tsquery[], '', '', "
        "'postgres=r/postgres', ARRAY['postgres=arw/postgres']::aclitem[], now())"
    )
    source_conn.execute(sql.SQL(row).format(s), (1,))
    db_project.write_config(
        {"tables": [{"name": f"{schema}.odd", "replication_key": "updated_at"}]}
    )
    first = db_project.run("sync", env=IN_PROCESS)
    assert first.exit_code == 0, first.output
    source_conn.execute(sql.SQL(row).format(s), (2,))
    later = db_project.run("sync", env=IN_PROCESS)
    assert later.exit_code == 0, later.output
    assert assert_same_table(source_conn, dest_conn, schema, "odd") == 2


def test_types_built_on_them_travel_as_text_too(db_project, source_conn, dest_conn, schema):
    """A domain over regclass, an array of it, a composite with a regclass attribute and a
    domain over tsquery: their values hold the same binary forms, so the rows go as text."""
    s = sql.Identifier(schema)
    dest_conn.execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(s))
    dest_conn.execute(sql.SQL("CREATE TABLE {}.padding (id int)").format(s))  # other OIDs
    for statement in (
        "CREATE TABLE {s}.target (id int PRIMARY KEY)",
        "CREATE DOMAIN {s}.rel AS regclass",
        "CREATE TYPE {s}.pointer AS (r regclass, n int)",
        "CREATE DOMAIN {s}.query AS tsquery",
        "CREATE TABLE {s}.wrapped (id int PRIMARY KEY, r {s}.rel, rs {s}.rel[], "
        "p {s}.pointer, q {s}.query)",
    ):
        source_conn.execute(sql.SQL(statement).format(s=s))
    source_conn.execute(
        sql.SQL(
            "INSERT INTO {s}.wrapped VALUES (1, %(t)s, ARRAY[%(t)s]::{s}.rel[], ROW(%(t)s, 1), '')"
        ).format(s=s),
        {"t": f"{schema}.target"},
    )
    tables = [{"name": f"{schema}.{t}", "mode": "full-refresh"} for t in ("target", "wrapped")]
    db_project.write_config({"tables": tables})
    result = db_project.run("sync", env=IN_PROCESS)
    assert result.exit_code == 0, result.output
    values = sql.SQL("SELECT r::text, rs::text, p::text, q::text FROM {}.wrapped").format(s)
    assert dest_conn.execute(values).fetchall() == [
        (f"{schema}.target", f"{{{schema}.target}}", f"({schema}.target,1)", "")
    ]
    assert_same_table(source_conn, dest_conn, schema, "wrapped")


def test_a_name_printed_without_its_schema_means_the_same_object_there(
    db_project, source_conn, dest_conn, schema
):
    """The source's sessions have the table's schema on their search_path, so regclass
    prints `target` bare; the destination's sessions find another `target` first on theirs:
    the rows are read under the source session's search_path, and name the same table."""
    s = sql.Identifier(schema)
    clash = f"{schema}_clash"
    dest_conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(clash)))
    dest_conn.execute(sql.SQL("CREATE TABLE {}.target (id int)").format(sql.Identifier(clash)))
    try:
        for statement in (
            "CREATE TABLE {s}.target (id int PRIMARY KEY)",
            "CREATE TABLE {s}.refs (id int PRIMARY KEY, r regclass)",
        ):
            source_conn.execute(sql.SQL(statement).format(s=s))
        source_conn.execute(
            sql.SQL("INSERT INTO {}.refs VALUES (1, %s)").format(s), (f"{schema}.target",)
        )
        tables = [{"name": f"{schema}.{t}", "mode": "full-refresh"} for t in ("target", "refs")]
        db_project.write_config({"tables": tables})

        def with_path(url: str, path: str) -> str:
            return f"{url}?options={quote(f'-c search_path={path}')}"

        env = {
            **IN_PROCESS,
            "REPLICATOR_SOURCE_URL": with_path(db_project.env["REPLICATOR_SOURCE_URL"], schema),
            "REPLICATOR_DEST_URL": with_path(db_project.env["REPLICATOR_DEST_URL"], clash),
        }
        result = db_project.run("sync", env=env)
        assert result.exit_code == 0, result.output
        same = sql.SQL("SELECT r::oid = {}::regclass::oid FROM {}.refs").format(
            sql.Literal(f"{schema}.target"), s
        )
        assert dest_conn.execute(same).fetchone() == (True,)
    finally:
        dest_conn.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(sql.Identifier(clash)))
