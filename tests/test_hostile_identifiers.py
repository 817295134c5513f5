"""Every command on tables whose schema, table and column names are as hostile as PostgreSQL
allows: quotes, dots, spaces, capitals, emoji, SQL keywords and 63-byte names.

Two 63-byte table names share their first 58 bytes, the most PostgreSQL keeps of a name in
`<name>_pkey`: the tool's own derived names (side, staging and key tables) must stay distinct,
and the destination keys get the names PostgreSQL itself would choose.
"""

from __future__ import annotations

import json
import uuid

import pytest
from dbcompare import assert_same_table, leftovers
from psycopg import sql

from replicator.base.identifiers import TableName, display_ident, quote_ident
from replicator.postgres.naming import derived_name, staging_table
from replicator.sync.scripts import side_table

pytestmark = pytest.mark.spark

LONG_PREFIX = "Ä" * 29  # 58 bytes
UPDATED = "Updated At"
KEY = '"Id" 😀'
LONG_COLUMN_A = "é" * 31 + "x"  # 63 bytes
LONG_COLUMN_B = "é" * 31 + "y"
NEW_COLUMN = 'new "col" 😀'


def _names(schema: str) -> dict[str, TableName]:
    return {
        "orders": TableName(schema, 'Order "Lines".😀 Ü'),
        "long_one": TableName(schema, LONG_PREFIX + "_key1"),
        "long_two": TableName(schema, LONG_PREFIX + "_key2"),
        "keyword": TableName(schema, "table"),
    }


def _ddl(names: dict[str, TableName]) -> list[str]:
    q = quote_ident
    return [
        f"CREATE TABLE {names['orders'].sql()} ({q(KEY)} bigint PRIMARY KEY, "
        f'"select" text, "a.b ""c""" int, {q(UPDATED)} timestamptz NOT NULL DEFAULT now())',
        f"CREATE INDEX ON {names['orders'].sql()} ({q(UPDATED)})",
        f"CREATE TABLE {names['long_one'].sql()} ({q(LONG_COLUMN_A)} bigint PRIMARY KEY, "
        f"{q(LONG_COLUMN_B)} text, {q(UPDATED)} timestamptz NOT NULL DEFAULT now())",
        f"CREATE INDEX ON {names['long_one'].sql()} ({q(UPDATED)})",
        f'CREATE TABLE {names["long_two"].sql()} ({q("Seq #")} bigint PRIMARY KEY, "FROM" text)',
        f'CREATE TABLE {names["keyword"].sql()} ("user" int PRIMARY KEY, "Order" text)',
    ]


def _fill(conn, names: dict[str, TableName], start: int, count: int) -> None:
    q = quote_ident
    rows = f"generate_series({start}, {start + count - 1}) g"
    conn.execute(
        f'INSERT INTO {names["orders"].sql()} ({q(KEY)}, "select", "a.b ""c""") '
        f"SELECT g, 'v' || g, g FROM {rows}"
    )
    conn.execute(
        f"INSERT INTO {names['long_one'].sql()} ({q(LONG_COLUMN_A)}, {q(LONG_COLUMN_B)}) "
        f"SELECT g, '😀' || g FROM {rows}"
    )
    conn.execute(f"INSERT INTO {names['long_two'].sql()} SELECT g, 'x' || g FROM {rows}")
    conn.execute(
        f"INSERT INTO {names['keyword'].sql()} SELECT g, g::text FROM {rows} "
        f'ON CONFLICT ("user") DO UPDATE SET "Order" = \'again\''
    )


@pytest.fixture
def hostile_schema(source_conn, dest_conn):
    name = f'Sales "EU".😀 select {uuid.uuid4().hex[:6]}'
    source_conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(name)))
    try:
        yield name
    finally:
        for conn in (source_conn, dest_conn):
            conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(name)))


def _sync(project, *args: str) -> dict[str, dict]:
    """`sync --log-format json`, which must succeed; each table's table.finished event."""
    result = project.run("sync", "--log-format", "json", *args)
    assert result.exit_code == 0, result.output
    events = [json.loads(line) for line in result.stderr.splitlines() if line.startswith("{")]
    return {e["name"]: e for e in events if e.get("event") == "table.finished"}


def _assert_all_equal(source_conn, dest_conn, names: dict[str, TableName]) -> None:
    keys = {"orders": KEY, "long_one": LONG_COLUMN_A, "long_two": "Seq #", "keyword": "user"}
    for label, name in names.items():
        assert assert_same_table(source_conn, dest_conn, name.schema, name.name, keys[label]) > 0


def _key_names(dest_conn, schema: str) -> dict[str, str]:
    rows = dest_conn.execute(
        "SELECT c.relname, k.conname FROM pg_constraint k JOIN pg_class c ON c.oid = k.conrelid "
        "JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = %s AND k.contype = 'p'",
        (schema,),
    ).fetchall()
    return dict(rows)


def test_derived_names_of_long_names_stay_distinct_and_within_63_bytes(hostile_schema):
    names = _names(hostile_schema)
    one, two = names["long_one"], names["long_two"]
    for kind in ("new", "stg", "pk"):
        assert derived_name(kind, one) != derived_name(kind, two)
        assert len(derived_name(kind, one).encode()) <= 63
    assert side_table(one) != side_table(two)
    assert staging_table(one) != staging_table(two)


def test_every_command_handles_hostile_identifiers(
    db_project, source_conn, dest_conn, hostile_schema, httpserver
):
    names = _names(hostile_schema)
    for statement in _ddl(names):
        source_conn.execute(statement)
    _fill(source_conn, names, 1, 300)
    written = {label: name.sql() for label, name in names.items()}
    httpserver.expect_request("/hook").respond_with_data("ok")
    db_project.write_config(
        {
            "tables": [
                {"name": written["orders"], "replication_key": quote_ident(UPDATED)},
                {"name": written["long_one"], "replication_key": quote_ident(UPDATED)},
                {
                    "name": written["long_two"],
                    "replication_key": quote_ident("Seq #"),
                    "mode": "incremental-append",
                },
                {"name": written["keyword"], "mode": "full-refresh"},
            ],
            "webhook": {"url": httpserver.url_for("/hook")},
        }
    )

    checked = db_project.run("check")
    assert checked.exit_code == 0, checked.output
    assert "Traceback" not in checked.output
    compiled = db_project.run("compile", "--json")
    assert compiled.exit_code == 0, compiled.output
    assert [t["name"] for t in json.loads(compiled.stdout)] == list(written.values())
    shown = db_project.run("compile")
    assert shown.exit_code == 0 and written["orders"] in shown.output

    first = _sync(db_project)
    assert {n: e["action"] for n, e in first.items()} == dict.fromkeys(
        written.values(), "full_reload"
    )
    _assert_all_equal(source_conn, dest_conn, names)
    keys = _key_names(dest_conn, hostile_schema)
    assert keys[names["long_one"].name] == LONG_PREFIX + "_pkey"
    assert keys[names["long_two"].name] == "Ä" * 28 + "_pkey1"  # as PostgreSQL would name it
    assert keys["table"] == "table_pkey"

    source_conn.execute(
        f"UPDATE {names['orders'].sql()} SET \"select\" = 'changed', {quote_ident(UPDATED)} = "
        f"clock_timestamp() WHERE {quote_ident(KEY)} % 7 = 0"
    )
    _fill(source_conn, names, 301, 50)
    second = _sync(db_project)
    assert [second[written[t]]["action"] for t in ("orders", "long_one", "long_two")] == [
        "incremental"
    ] * 3
    _assert_all_equal(source_conn, dest_conn, names)
    noop = _sync(db_project, "-s", written["orders"])
    assert noop[written["orders"]]["action"] == "noop"
    resynced = _sync(db_project, "-s", written["long_one"], "--since", "2000-01-01")
    assert resynced[written["long_one"]]["reason"].endswith(
        "re-sync 2000-01-01 00:00:00+00 .. newest"
    )
    one = db_project.run("compile", "-s", written["long_two"])
    assert one.exit_code == 0 and "-- next sync: incremental" in one.output, one.output

    status = db_project.run("status", "--json")
    assert status.exit_code == 0, status.output
    assert {t["name"] for t in json.loads(status.stdout)} == set(written.values())
    state = db_project.run("state", "show", written["long_one"])
    assert state.exit_code == 0 and json.loads(state.stdout)[written["long_one"]]["cursor"]

    assert db_project.run("refresh", written["long_one"]).exit_code == 0
    assert db_project.run("state", "reset", written["long_two"]).exit_code == 0
    set_cursor = db_project.run("state", "set-cursor", written["orders"], "2000-01-01 00:00:00+00")
    assert set_cursor.exit_code == 0, set_cursor.output
    source_conn.execute(
        f"ALTER TABLE {names['orders'].sql()} ADD COLUMN {quote_ident(NEW_COLUMN)} text DEFAULT 'x'"
    )
    dest_conn.execute(f"DROP TABLE {names['keyword'].sql()}")
    third = _sync(db_project)
    reasons = {label: third[written[label]]["reason"] for label in names}
    assert reasons["orders"].startswith('schema changed: column added: "new ""col"" 😀"')
    assert reasons["long_one"] == "refresh requested"
    assert reasons["long_two"] == "no state"
    assert reasons["keyword"] == "mode full-refresh"
    _assert_all_equal(source_conn, dest_conn, names)
    assert _key_names(dest_conn, hostile_schema) == keys  # reloads keep the key names

    assert leftovers(dest_conn, list(names.values())) == []
    payloads = [json.loads(request.data) for request, _ in httpserver.log]
    assert len(payloads) == 5  # one per sync
    assert [t["name"] for t in payloads[-1]["tables"]] == list(written.values())


def test_every_keyword_the_server_quotes_is_quoted_in_messages(source_conn):
    """The statements messages give to run name columns as display_ident writes them: a
    keyword left bare (`PRIMARY KEY (order)`) would not parse."""
    words = source_conn.execute("SELECT word FROM pg_get_keywords() WHERE catcode <> 'U'")
    bare = [w for (w,) in words.fetchall() if display_ident(w) == w]
    assert not bare, bare
    for word in ("order", "user", "select"):
        source_conn.execute(sql.SQL("SELECT 1 AS " + display_ident(word)))
