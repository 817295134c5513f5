"""A column's own collation (`COLLATE "C"`, an ICU one) is the copy's too: the same rows
compare and sort the same way on both sides, in a full load, an incremental batch and the
log. A copy made before collations were carried is reloaded once, saying why."""

from __future__ import annotations

import json

from dbcompare import assert_same_table
from psycopg import sql

COLLATED = (
    'CREATE TABLE {} (k text COLLATE "und-x-icu" PRIMARY KEY, c text COLLATE "C", '
    "plain text, updated_at timestamptz NOT NULL DEFAULT clock_timestamp())"
)


def _collations(conn, schema, table="words"):
    return dict(
        conn.execute(
            "SELECT a.attname, co.collname FROM pg_attribute a "
            "LEFT JOIN pg_collation co ON co.oid = a.attcollation AND a.attcollation <> 100 "
            "WHERE a.attrelid = %s::regclass AND a.attnum > 0 AND NOT a.attisdropped",
            (f'"{schema}"."{table}"',),
        ).fetchall()
    )


def _below_b(conn, schema, table="words"):
    return conn.execute(
        sql.SQL(
            "SELECT count(*) FILTER (WHERE k < 'b'), count(*) FILTER (WHERE c < 'b') FROM {}"
        ).format(sql.Identifier(schema, table))
    ).fetchone()


def test_a_columns_collation_is_the_copys_in_every_mode(db_project, schema, source_conn, dest_conn):
    for table in ("words", "logged"):
        source_conn.execute(sql.SQL(COLLATED).format(sql.Identifier(schema, table)))
        source_conn.execute(
            sql.SQL(
                "INSERT INTO {} (k, c, plain) SELECT w, w, w FROM unnest(ARRAY['a', 'B', 'b', "
                "'Z', 'z', 'é', 'E']) AS w"
            ).format(sql.Identifier(schema, table))
        )
    db_project.write_config(
        {
            "tables": [
                {"name": f"{schema}.words", "replication_key": "updated_at"},
                {"name": f"{schema}.logged", "mode": "cdc"},
            ]
        }
    )
    first = db_project.run("sync")
    assert first.exit_code == 0, first.output
    for table in ("words", "logged"):
        assert _collations(dest_conn, schema, table) == {
            "k": "und-x-icu",
            "c": "C",
            "plain": None,
            "updated_at": None,
        }
        assert _below_b(dest_conn, schema, table) == _below_b(source_conn, schema, table)
    for table in ("words", "logged"):
        source_conn.execute(
            sql.SQL(
                "INSERT INTO {} (k, c, plain) VALUES ('A', 'A', 'A'); "
                "UPDATE {} SET c = 'y', updated_at = clock_timestamp() WHERE k = 'a'"
            ).format(sql.Identifier(schema, table), sql.Identifier(schema, table))
        )
    second = db_project.run("sync")
    assert second.exit_code == 0, second.output
    assert "full_reload" not in second.stderr, second.stderr
    for table in ("words", "logged"):
        assert_same_table(source_conn, dest_conn, schema, table, key="k")
        assert _below_b(dest_conn, schema, table) == _below_b(source_conn, schema, table)
    verified = db_project.run("verify", "--json")
    assert [v["status"] for v in json.loads(verified.stdout)] == ["equal", "equal"]


def test_a_copy_without_its_collation_is_reloaded_once(db_project, schema, source_conn, dest_conn):
    """A copy whose column lost its collation (or was made before collations were carried:
    its sync-state says `text`) reloads, saying why, and then has it."""
    source_conn.execute(sql.SQL(COLLATED).format(sql.Identifier(schema, "words")))
    source_conn.execute(
        sql.SQL("INSERT INTO {} (k, c) VALUES ('a', 'a'), ('B', 'B')").format(
            sql.Identifier(schema, "words")
        )
    )
    db_project.write_config(
        {"tables": [{"name": f"{schema}.words", "replication_key": "updated_at"}]}
    )
    assert db_project.run("sync").exit_code == 0
    dest_conn.execute(
        sql.SQL('ALTER TABLE {} ALTER COLUMN c TYPE text COLLATE "default"').format(
            sql.Identifier(schema, "words")
        )
    )
    altered = db_project.run("sync")
    assert altered.exit_code == 0 and "full_reload" in altered.stderr, altered.output
    assert _collations(dest_conn, schema)["c"] == "C"

    state = db_project.path / "sync-state" / f"{schema}.words.json"
    document = json.loads(state.read_text())
    for column in document["schema_signature"]["columns"]:
        column["type"] = column["type"].split(" COLLATE ")[0]  # as an older version wrote it
    state.write_text(json.dumps(document))
    upgraded = db_project.run("sync")
    assert upgraded.exit_code == 0, upgraded.output
    assert 'type changed: c text -> text COLLATE pg_catalog."C"' in upgraded.stderr
    assert _collations(dest_conn, schema)["c"] == "C"
    assert "full_reload" not in db_project.run("sync").stderr


def test_a_collation_of_the_users_own_is_created_in_the_destination(
    db_project, schema, source_conn, dest_conn
):
    """`CREATE COLLATION` in the source (an ICU one that ignores case, a libc one, one a
    domain declares): made in the destination with the same definition before the table,
    which compares alike."""
    s = sql.Identifier(schema)
    for statement in (
        "CREATE COLLATION {s}.nocase (provider = icu, locale = 'und-u-ks-level2', "
        "deterministic = false)",
        "CREATE COLLATION {s}.bytes (provider = libc, locale = 'C')",
        "CREATE COLLATION {s}.nocase2 (provider = icu, locale = 'und-u-ks-level2', "
        "deterministic = false)",
        "CREATE DOMAIN {s}.label AS text COLLATE {s}.nocase2",
        "CREATE TABLE {s}.names (id int PRIMARY KEY, n text COLLATE {s}.nocase, "
        "b text COLLATE {s}.bytes, l {s}.label)",
        "INSERT INTO {s}.names VALUES (1, 'Anna', 'Anna', 'X'), (2, 'anna', 'anna', 'x'), "
        "(3, 'Bo', 'Bo', 'y')",
    ):
        source_conn.execute(sql.SQL(statement).format(s=s))
    db_project.write_config({"tables": [{"name": f"{schema}.names", "mode": "full-refresh"}]})
    checked = db_project.run("check")
    assert checked.exit_code == 0, checked.output
    first = db_project.run("sync")
    assert first.exit_code == 0, first.output
    assert _collations(dest_conn, schema, "names") == {
        "id": None,
        "n": "nocase",
        "b": "bytes",
        "l": "nocase2",  # the domain's
    }
    same = sql.SQL(
        "SELECT count(*) FILTER (WHERE n = 'ANNA'), count(*) FILTER (WHERE b < 'a'), "
        "count(*) FILTER (WHERE l = 'X') FROM {}"
    )
    query = same.format(sql.Identifier(schema, "names"))
    assert dest_conn.execute(query).fetchone() == source_conn.execute(query).fetchone() == (2, 2, 2)
    assert_same_table(source_conn, dest_conn, schema, "names")
    again = db_project.run("sync")  # the collations are there now: nothing to make
    assert again.exit_code == 0, again.output
