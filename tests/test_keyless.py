"""Tables without a primary key: a unique index over NOT NULL columns keys them in every
mode (`check` names it); a table with no usable key at all is copied by `full-refresh` and
verified (and repaired) as a multiset of rows; the modes that need a key refuse it with the
fix. Real servers; copies in this process (the suite's Spark path is tested elsewhere)."""

from __future__ import annotations

import json
from collections import Counter

import pytest
from dbcompare import assert_same_table
from engines import IN_PROCESS
from psycopg import sql

pytestmark = pytest.mark.spark

EVENTS = "Events.Log"


def _run(conn, schema, statement, table):
    conn.execute(sql.SQL(statement).format(t=sql.Identifier(schema, table)))


def _verify(project, *args):
    result = project.run("verify", "--json", *args, env=IN_PROCESS)
    return result, {v["name"]: v for v in json.loads(result.stdout)}


def _multiset(conn, schema, table):
    """Every distinct row's text, with how many times the table holds it."""
    rows = conn.execute(
        sql.SQL("SELECT t::text, count(*) FROM {} AS t GROUP BY 1").format(
            sql.Identifier(schema, table)
        )
    ).fetchall()
    return Counter(dict(rows))


def _keys(conn, schema, table):
    """The primary key's columns of a table, in order."""
    rows = conn.execute(
        "SELECT a.attname FROM pg_index i "
        "CROSS JOIN LATERAL unnest(i.indkey) WITH ORDINALITY AS k(n, o) "
        "JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.n "
        "WHERE i.indrelid = %s::regclass AND i.indisprimary ORDER BY k.o",
        (sql.Identifier(schema, table).as_string(conn),),
    ).fetchall()
    return [r[0] for r in rows]


def _orders(conn, schema):
    """No primary key; unique indexes that cannot key it (a NULL-able column, a partial
    index, an expression) beside two that can: the one-column one is picked."""
    _run(
        conn,
        schema,
        "CREATE TABLE {t} (id int NOT NULL, code text NOT NULL, shop int NOT NULL, "
        "email text, note text, updated_at timestamptz NOT NULL); "
        "CREATE UNIQUE INDEX orders_email_key ON {t} (email); "
        "CREATE UNIQUE INDEX orders_a_partial ON {t} (id) WHERE id > 0; "
        "CREATE UNIQUE INDEX orders_b_lower ON {t} (lower(code)); "
        "CREATE UNIQUE INDEX orders_c_pair ON {t} (shop, id); "
        "CREATE UNIQUE INDEX orders_code_key ON {t} (code); "
        "INSERT INTO {t} SELECT g, 'C' || g, g % 3, NULL, 'n' || g, "
        "now() - interval '1 day' + g * interval '1 second' FROM generate_series(1, 300) g",
        "orders",
    )


def test_a_unique_index_keys_an_incremental_table(db_project, schema, source_conn, dest_conn):
    _orders(source_conn, schema)
    db_project.write_config(
        {"tables": [{"name": f"{schema}.orders", "replication_key": "updated_at"}]}
    )
    db_project.sync(env=IN_PROCESS)
    _run(
        source_conn,
        schema,
        "UPDATE {t} SET note = 'changed', updated_at = now() WHERE id IN (5, 250); "
        "INSERT INTO {t} VALUES (301, 'C301', 1, NULL, 'new', now())",
        "orders",
    )
    second = db_project.sync(env=IN_PROCESS)
    assert "orders: incremental" in second.stderr, second.stderr
    assert assert_same_table(source_conn, dest_conn, schema, "orders", key="code") == 301
    assert _keys(dest_conn, schema, "orders") == ["code"]
    result, verdicts = _verify(db_project)
    assert result.exit_code == 0, result.output
    verdict = verdicts[f"{schema}.orders"]
    assert (verdict["status"], verdict["rows_compared"]) == ("equal", 301)

    _run(source_conn, schema, "DROP INDEX {t}", "orders_code_key")  # the next one keys it
    third = db_project.sync(env=IN_PROCESS)
    assert "reason: schema changed: primary key changed: (code) -> (shop, id)" in third.stderr
    assert _keys(dest_conn, schema, "orders") == ["shop", "id"]


def test_check_names_the_unique_index_and_a_configured_key_wins(db_project, schema, source_conn):
    _orders(source_conn, schema)
    entry = {"name": f"{schema}.orders", "replication_key": "updated_at"}
    db_project.write_config({"tables": [entry]})
    checked = db_project.run("check")
    assert checked.exit_code == 0, checked.output
    assert (
        f"ok    {schema}.orders: table, 6 columns, key from unique index orders_code_key (code)"
    ) in checked.stdout
    db_project.write_config({"tables": [{**entry, "primary_key": ["shop", "id"]}]})
    checked = db_project.run("check")
    assert f"ok    {schema}.orders: table, 6 columns, primary key (shop, id)" in checked.stdout


def _events(conn, schema, table="events"):
    """No usable key, rows that repeat (NULLs included), and a name with a `%`."""
    _run(
        conn,
        schema,
        'CREATE TABLE {t} ("Kind %s" text, n int, at date, ref int); '
        "CREATE UNIQUE INDEX ON {t} (ref); "  # NULL-able: not a key
        "INSERT INTO {t} SELECT 'k' || (g % 7), g % 400, date '2026-01-01' + g % 3, "
        "CASE WHEN g <= 10 THEN g END FROM generate_series(1, 3000) g; "
        "INSERT INTO {t} VALUES (NULL, NULL, NULL), (NULL, NULL, NULL), ('dup', 1, NULL)",
        table,
    )


def test_a_table_without_a_key_is_copied_verified_and_repaired_as_a_multiset(
    db_project, schema, source_conn, dest_conn
):
    _events(source_conn, schema, EVENTS)
    name = f'{schema}."{EVENTS}"'
    db_project.write_config({"tables": [{"name": name, "mode": "full-refresh"}]})
    db_project.sync(env=IN_PROCESS)
    expected = _multiset(source_conn, schema, EVENTS)
    assert max(expected.values()) > 1, "the source holds duplicate rows"
    assert _multiset(dest_conn, schema, EVENTS) == expected
    checked = db_project.run("check")
    assert f"{name}: table, 4 columns, no key (no primary key, no unique index" in checked.stdout

    result, verdicts = _verify(db_project)
    assert result.exit_code == 0, result.output
    verdict = verdicts[name]
    assert (verdict["status"], verdict["rows_compared"]) == ("equal", 3003)

    events = sql.Identifier(schema, EVENTS)
    dest_conn.execute(  # one copy of a duplicate deleted, one row added
        sql.SQL(
            'DELETE FROM {t} WHERE ctid = (SELECT ctid FROM {t} WHERE "Kind %s" IS NULL LIMIT 1); '
            "INSERT INTO {t} VALUES ('added', -1, date '2026-02-01', 11)"
        ).format(t=events)
    )
    before = dest_conn.execute(sql.SQL("SELECT xmin::text FROM {}").format(events)).fetchall()
    result, verdicts = _verify(db_project)
    assert result.exit_code == 1, result.output
    verdict = verdicts[name]
    assert verdict["status"] == "different"
    assert (verdict["missing"], verdict["extra"], verdict["different"]) == (1, 1, 0)
    assert sorted(verdict["examples"], key=lambda e: e["kind"]) == [
        {
            "key": {"Kind %s": "added", "n": -1, "at": "2026-02-01", "ref": 11},
            "kind": "extra",
            "count": 1,
        },
        {
            "key": {"Kind %s": None, "n": None, "at": None, "ref": None},
            "kind": "missing",
            "count": 1,
        },
    ]

    repaired, verdicts = _verify(db_project, "--repair")
    assert repaired.exit_code == 0, repaired.output
    assert verdicts[name]["repaired"] == 2
    assert _multiset(dest_conn, schema, EVENTS) == expected
    after = dest_conn.execute(sql.SQL("SELECT xmin::text FROM {}").format(events)).fetchall()
    written = Counter(after) - Counter(before)
    assert sum(written.values()) == 1, "only the missing copy is written"
    again, verdicts = _verify(db_project)
    assert again.exit_code == 0 and verdicts[name]["status"] == "equal"


@pytest.mark.parametrize("mode", ["incremental-deduped", "incremental-append"])
def test_modes_that_need_a_key_refuse_a_table_without_one(db_project, schema, source_conn, mode):
    _events(source_conn, schema)
    db_project.write_config(
        {"tables": [{"name": f"{schema}.events", "replication_key": "n", "mode": mode}]}
    )
    result = db_project.run("sync", env=IN_PROCESS)
    assert result.exit_code == 1
    message = " ".join(result.stderr.split())
    assert f"error {schema}.events: failed after" in message
    assert f"the source table has no primary key, which mode {mode} needs (" in message
    assert (
        "and no unique index over NOT NULL columns (valid, not partial, not on expressions, "
        "comparing values as its columns do) to use instead: add a primary key or such an index "
        "to the source table, set "
        '"primary_key" in tables-config.json (columns that identify a row), or use "mode": '
        '"full-refresh"'
    ) in message


def test_cdc_by_a_unique_index_needs_it_as_the_replica_identity(
    cdc_project, schema, writer, source_conn, dest_conn
):
    _run(
        writer,
        schema,
        "CREATE TABLE {t} (code text NOT NULL, note text); "
        "CREATE UNIQUE INDEX items_code_key ON {t} (code); "
        "INSERT INTO {t} SELECT 'c' || g, 'n' || g FROM generate_series(1, 50) g",
        "items",
    )
    cdc_project.write_config({"tables": [{"name": f"{schema}.items", "mode": "cdc"}]})
    checked = cdc_project.run("check")
    assert checked.exit_code == 1
    assert (
        f"error {schema}.items: mode cdc names rows by the key from unique index "
        "items_code_key (code), but the log names them by (none: the table has no primary "
        f"key), so their updates and deletes could not be applied: run `ALTER TABLE "
        f"{schema}.items REPLICA IDENTITY USING INDEX items_code_key` in the source"
    ) in " ".join(checked.stdout.split())

    _run(writer, schema, "ALTER TABLE {t} REPLICA IDENTITY USING INDEX items_code_key", "items")
    assert cdc_project.run("check").exit_code == 0
    cdc_project.sync(env=IN_PROCESS)
    _run(
        writer,
        schema,
        "UPDATE {t} SET note = 'changed' WHERE code = 'c1'; DELETE FROM {t} WHERE code = 'c2'; "
        "UPDATE {t} SET code = 'moved' WHERE code = 'c3'; INSERT INTO {t} VALUES ('c51', 'new')",
        "items",
    )
    second = cdc_project.sync(env=IN_PROCESS)
    assert "items: incremental" in second.stderr, second.stderr
    assert assert_same_table(source_conn, dest_conn, schema, "items", key="code") == 50
