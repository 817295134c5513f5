"""Columns of a type an extension defines (citext): the destination gets the extension, never
a hand-made imitation of its type, and `check` says so before the first sync. The loading
role that may not create it is tested in test_privileges.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from dbcompare import assert_same_table
from psycopg import sql

pytestmark = pytest.mark.spark

CITEXT = Path("/usr/share/postgresql/15/extension/citext.control")


@pytest.fixture
def emails(source_conn, schema) -> str:
    """A table with a citext column, a citext[] one and a domain over citext; the extension
    lives in the test's schema on the source (dropped with it)."""
    if not CITEXT.exists():
        pytest.skip("citext is not installed with this PostgreSQL (the contrib modules)")
    s = sql.Identifier(schema)
    for statement in (
        "CREATE EXTENSION citext SCHEMA {s}",
        "CREATE DOMAIN {s}.email AS {s}.citext CHECK (VALUE LIKE '%@%')",
        "CREATE TABLE {s}.people (id int PRIMARY KEY, name {s}.citext NOT NULL, "
        "tags {s}.citext[], mail {s}.email, updated_at timestamptz NOT NULL DEFAULT now())",
        "INSERT INTO {s}.people (id, name, tags, mail) SELECT g, 'Ünïcode ' || g, "
        "ARRAY['A', NULL, 'b ' || g]::{s}.citext[], 'User' || g || '@Example.com' "
        "FROM generate_series(1, 50) g",
        "INSERT INTO {s}.people (id, name) VALUES (51, '')",
    ):
        source_conn.execute(sql.SQL(statement).format(s=s))
    return schema


def test_a_citext_column_gets_its_extension_created_and_copies_exactly(
    db_project, source_conn, dest_conn, emails
):
    db_project.write_config(
        {"tables": [{"name": f"{emails}.people", "replication_key": "updated_at"}]}
    )
    statement = f"CREATE EXTENSION IF NOT EXISTS citext SCHEMA {emails}"
    checked = db_project.run("check")
    assert checked.exit_code == 0, checked.stdout
    assert (
        f"ok    {emails}.people: extension citext will be created by the first sync "
        f"({statement}): columns mail, name, tags use type "
        f"{emails}.citext of extension citext, which the destination lacks" in checked.stdout
    ), checked.stdout
    compiled = db_project.run("compile", "--json")
    assert compiled.exit_code == 0, compiled.output
    script = json.loads(compiled.stdout)[0]["sql"]["full_reload"]
    created = [i for i, text in enumerate(script) if text.startswith("CREATE EXTENSION")]
    domain = [i for i, text in enumerate(script) if text.startswith("CREATE DOMAIN")]
    assert len(created) == 1 and len(domain) == 1 and created[0] < domain[0], script
    assert "CREATE TYPE" not in "\n".join(script), "an extension's type is never made by hand"

    synced = db_project.run("sync")
    assert synced.exit_code == 0, synced.output
    assert assert_same_table(source_conn, dest_conn, emails, "people") == 51
    (where,) = dest_conn.execute(
        "SELECT n.nspname FROM pg_extension e JOIN pg_namespace n ON n.oid = e.extnamespace "
        "WHERE e.extname = 'citext'"
    ).fetchone()
    assert where == emails
    dest_conn.execute(sql.SQL("SET search_path = {}").format(sql.Identifier(emails)))
    (matched,) = dest_conn.execute(
        "SELECT count(*) FROM people WHERE mail = 'USER7@example.COM' AND 'b 7' = ANY(tags)"
    ).fetchone()
    dest_conn.execute("RESET search_path")
    assert matched == 1, "the copy compares case-insensitively: it is citext"

    source_conn.execute(
        sql.SQL(
            "UPDATE {} SET name = 'Changed', updated_at = now() + interval '1 min' WHERE id = 3"
        ).format(sql.Identifier(emails, "people"))
    )
    assert db_project.run("sync", "-f").exit_code == 0
    assert db_project.run("sync").exit_code == 0
    assert assert_same_table(source_conn, dest_conn, emails, "people") == 51
    checked = db_project.run("check")
    assert checked.exit_code == 0 and "extension citext" not in checked.stdout, checked.stdout


def test_a_key_respelled_as_its_type_allows_takes_the_sources_spelling(
    cdc_project, source_conn, dest_conn, writer, schema
):
    """citext's `a@x` = `A@x`: an update that changes only the case of a key conflicts with
    the copy's old spelling. The merge kept that spelling and the delete check then deleted
    the row (it read the source's spelling as missing, the copy's as gone); the log's apply
    kept it too. Both copies take the source's spelling, and nothing is deleted."""
    if not CITEXT.exists():
        pytest.skip("citext is not installed with this PostgreSQL (the contrib modules)")
    s = sql.Identifier(schema)
    for statement in (
        "CREATE EXTENSION citext SCHEMA {s}",
        "CREATE TABLE {s}.users (email {s}.citext PRIMARY KEY, name text, "
        "updated_at timestamptz NOT NULL DEFAULT now() - interval '1 hour')",
        "CREATE TABLE {s}.accounts (email {s}.citext PRIMARY KEY, note text)",
        "INSERT INTO {s}.users (email, name) SELECT 'user' || g || '@example.com', 'n' "
        "FROM generate_series(1, 20) g",
        "INSERT INTO {s}.accounts SELECT 'user' || g || '@example.com', 'n' "
        "FROM generate_series(1, 20) g",
    ):
        writer.execute(sql.SQL(statement).format(s=s))
    cdc_project.write_config(
        {
            "tables": [
                {"name": f"{schema}.users", "replication_key": "updated_at", "deletes": "delete"},
                {"name": f"{schema}.accounts", "mode": "cdc"},
            ]
        }
    )
    assert cdc_project.run("sync").exit_code == 0
    writer.execute(
        sql.SQL(
            "UPDATE {s}.users SET email = 'User3@Example.com', updated_at = now() "
            "WHERE email = 'user3@example.com'; "
            "UPDATE {s}.accounts SET email = 'USER4@example.com', note = 'x' "
            "WHERE email = 'user4@example.com'"
        ).format(s=s)
    )
    synced = cdc_project.run("sync")
    assert synced.exit_code == 0, synced.output
    assert "no longer in the source" not in synced.stderr, synced.stderr
    for table in ("users", "accounts"):
        assert assert_same_table(source_conn, dest_conn, schema, table, key="email") == 20
    verified = cdc_project.run("verify")
    assert verified.exit_code == 0, verified.output
    assert "different" not in verified.stderr.replace("0 different", "")
    # The log names the deleted row by its newer spelling, the copy holds the older one
    # (one batch): the apply's `=` found no citext operator on the destination session's
    # search_path, compared them as text and deleted nothing, exit 0.
    writer.execute(
        sql.SQL(
            "UPDATE {s}.accounts SET email = 'USER5@example.com' WHERE email = 'user5@example.com';"
            " DELETE FROM {s}.accounts WHERE email = 'USER5@example.com'"
        ).format(s=s)
    )
    synced = cdc_project.run("sync", "-s", f"{schema}.accounts")
    assert synced.exit_code == 0, synced.output
    assert assert_same_table(source_conn, dest_conn, schema, "accounts", key="email") == 19
    compiled = json.loads(cdc_project.run("compile", "--json", "-s", f"{schema}.accounts").stdout)
    apply = "\n".join(compiled[0]["sql"]["cdc_apply"])
    assert f'"d"."email" OPERATOR("{schema}".=) "l"."email"' in apply, apply
