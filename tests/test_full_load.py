"""Full loads through Spark, against real clusters: exact values, one snapshot, atomic swap."""

from __future__ import annotations

import json
import re
import threading
import time

import psycopg
import pytest
from dbcompare import assert_same_table, leftovers, row_hashes
from engines import IN_PROCESS
from psycopg import sql

from replicator.base.identifiers import TableName
from replicator.postgres.naming import retired_table

pytestmark = pytest.mark.spark

EVERY_TYPE = """
CREATE TYPE {s}.mood AS ENUM ('sad', 'ok', 'happy 😀');
CREATE DOMAIN {s}.positive AS numeric CHECK (VALUE > 0);
CREATE TYPE {s}.pair AS (a int, m {s}.mood);
CREATE TABLE {s}.everything (
  id int PRIMARY KEY, n numeric, n2 numeric(12,2), f4 real, f8 double precision,
  i2 smallint, i8 bigint, b boolean, t text, vc varchar(10), ch char(5), qc "char",
  d date, ts timestamp, tstz timestamptz, tm time, tmtz timetz, iv interval,
  e {s}.mood, ea {s}.mood[], dom {s}.positive, comp {s}.pair,
  ia int[], ta text[], na numeric[], tsa timestamptz[], "by" bytea, j json, jb jsonb,
  r int4range, tr tstzrange, nr numrange, tsv tsvector, m money, bt bit(4), vb bit varying(8),
  u uuid, ip inet, cd cidr, mac macaddr, pt point, x xml, o oid
);
INSERT INTO {s}.everything VALUES
 (1, 'NaN', 123.45, 'Infinity', '-Infinity', -32768, 9223372036854775807, true,
  E'tab\\there\\nnewline \\\\ backslash "quote" '' \\r\\n crlf', 'ü😀', 'ab', 'x',
  'infinity', '4713-01-01 00:00:00.000001 BC', '2026-11-20 10:00:00.123456+05:30',
  '23:59:59.999999', '12:00:00.5+03', '1 year 2 mons -3 days 04:05:06.789',
  'happy 😀', '{sad,NULL,ok}', 5.5, '(1,sad)', '{1,NULL,3}', '{"a,b",NULL,"",null}',
  '{NaN,1.5,-0}', '{-infinity,"2026-01-01 00:00:00+00"}', '\\x00ff00', '{"b": 1,  "a": [1, 2]}',
  '{"b": 1,  "a": [1, 2]}', '[1,5)', '[2026-01-01,infinity)', '(,5]', 'a:1 fat:2 rat', 12.34,
  B'1010', B'101', 'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11', '192.168.0.1/24', '10.0.0.0/8',
  '08:00:2b:01:02:03', '(1.5,2)', '<a>1</a>', 42),
 (3, 0, -0.00, '-0', 'NaN', 0, 0, false, '', '', '', ' ', '-infinity', '2000-02-29',
  '1970-01-01 00:00:00+00', '00:00', '00:00+00', '0', 'sad', '{}', 0.0000001, '(,)', '{}',
  '{}', '{}', '{}', '', '""', '""', 'empty', 'empty', 'empty', '', -0.01, B'0000', B'',
  '00000000-0000-0000-0000-000000000000', '::1', '::/0', '00:00:00:00:00:00', '(0,0)', '', 0);
INSERT INTO {s}.everything (id, n, f4, f8, t, tstz, iv, ea, "by", jb, na)
SELECT g, (g * 1.000000000000000001)::numeric / 7, g / 3.0, 1 / g::float8 + 1e-300,
       repeat(chr(33 + g % 90), g % 50), '2026-01-01'::timestamptz + g * interval '1.000001 s',
       make_interval(secs => g / 1000.0), ARRAY['ok', NULL]::{s}.mood[],
       decode(lpad(to_hex(g), 8, '0'), 'hex'), jsonb_build_object('g', g, 'f', g / 3.0),
       ARRAY[g / 9.0, NULL]
FROM generate_series(4, 3000) g;
INSERT INTO {s}.everything (id) VALUES (2);
"""


def test_every_type_round_trips_exactly(db_project, source_conn, dest_conn, schema):
    source_conn.execute(EVERY_TYPE.replace("{s}", sql.Identifier(schema).as_string(source_conn)))
    db_project.write_config(
        {"tables": [{"name": f"{schema}.everything", "mode": "full-refresh", "partitions": 3}]}
    )
    result = db_project.run("sync", env={"TZ": "America/New_York"})
    assert result.exit_code == 0, result.output
    assert f"{schema}.everything: full_reload, 3,000 rows" in result.stderr
    assert assert_same_table(source_conn, dest_conn, schema, "everything") == 3000
    special = dest_conn.execute(
        sql.SQL(
            'SELECT n::text, f4::text, d::text, e::text, comp::text, j::text, "by" FROM {} '
            "WHERE id = 1"
        ).format(sql.Identifier(schema, "everything"))
    ).fetchone()
    assert special == (
        "NaN",
        "Infinity",
        "infinity",
        "happy 😀",
        "(1,sad)",
        '{"b": 1,  "a": [1, 2]}',
        b"\x00\xff\x00",
    )


def test_partitions_share_one_snapshot_under_concurrent_transfers(
    db_project, source_conn, dest_conn, schema, pg_servers
):
    """Transfers move money between accounts during the load; a load that mixed snapshots
    would see a total that never existed."""
    accounts = sql.Identifier(schema, "accounts")
    source_conn.execute(
        sql.SQL("CREATE TABLE {} (id int PRIMARY KEY, balance bigint NOT NULL)").format(accounts)
    )
    source_conn.execute(
        sql.SQL("INSERT INTO {} SELECT g, 1000 FROM generate_series(1, 200000) g").format(accounts)
    )
    total = 200000 * 1000
    stop, transfers = threading.Event(), [0]

    def transfer() -> None:
        with psycopg.connect(pg_servers.source_url, autocommit=True) as conn:
            i = 0
            while not stop.is_set():
                i += 1
                a, b = (i * 7919) % 200000 + 1, (i * 104729) % 200000 + 1
                with conn.transaction():
                    conn.execute(
                        sql.SQL("UPDATE {} SET balance = balance - 5 WHERE id = %s").format(
                            accounts
                        ),
                        (a,),
                    )
                    conn.execute(
                        sql.SQL("UPDATE {} SET balance = balance + 5 WHERE id = %s").format(
                            accounts
                        ),
                        (b,),
                    )
                transfers[0] += 1

    db_project.write_config(
        {"tables": [{"name": f"{schema}.accounts", "mode": "full-refresh", "partitions": 4}]}
    )
    worker = threading.Thread(target=transfer)
    worker.start()
    try:
        time.sleep(0.3)
        before = transfers[0]
        result = db_project.run("sync")
        during = transfers[0] - before
    finally:
        stop.set()
        worker.join()
    assert result.exit_code == 0, result.output
    assert during > 10, "transfers must run while the table is copied"
    (dest_total, rows) = dest_conn.execute(
        sql.SQL("SELECT sum(balance), count(*) FROM {}").format(accounts)
    ).fetchone()
    assert (dest_total, rows) == (total, 200000)


def test_swap_is_atomic_for_readers_and_keeps_views_grants_comments(
    db_project, source_conn, dest_conn, schema, pg_servers
):
    orders = sql.Identifier(schema, "orders")
    source_conn.execute(
        sql.SQL("CREATE TABLE {} (id int PRIMARY KEY, amount numeric(12,2), note text)").format(
            orders
        )
    )
    source_conn.execute(
        sql.SQL(
            "INSERT INTO {} SELECT g, g * 1.5, 'n' || g FROM generate_series(1, 50000) g"
        ).format(orders)
    )
    db_project.write_config(
        {"tables": [{"name": f"{schema}.orders", "mode": "full-refresh", "partitions": 2}]}
    )
    assert db_project.run("sync").exit_code == 0
    view, view2 = sql.Identifier(schema, "big_orders"), sql.Identifier(schema, "big_ids")
    dest_conn.execute(
        "DO $$ BEGIN CREATE ROLE analyst; EXCEPTION WHEN duplicate_object THEN NULL; END $$"
    )
    dest_conn.execute(
        sql.SQL(
            "CREATE VIEW {} WITH (security_barrier) AS SELECT id, amount FROM {} WHERE amount > 100"
        ).format(view, orders)
    )
    dest_conn.execute(sql.SQL("CREATE VIEW {} AS SELECT id FROM {}").format(view2, view))
    dest_conn.execute(sql.SQL("GRANT SELECT ON {} TO analyst").format(orders))
    dest_conn.execute(sql.SQL("GRANT SELECT ON {} TO analyst").format(view2))
    dest_conn.execute(sql.SQL("COMMENT ON TABLE {} IS 'orders copy'").format(orders))
    dest_conn.execute(sql.SQL("COMMENT ON COLUMN {}.amount IS 'in EUR'").format(orders))
    source_conn.execute(sql.SQL("INSERT INTO {} VALUES (50001, 999, 'new')").format(orders))

    stop, seen, errors = threading.Event(), set(), []

    def read() -> None:
        with psycopg.connect(pg_servers.dest_url, autocommit=True) as conn:
            while not stop.is_set():
                try:
                    seen.add(
                        conn.execute(sql.SQL("SELECT count(*) FROM {}").format(orders)).fetchone()[
                            0
                        ]
                    )
                except psycopg.Error as exc:
                    errors.append(str(exc))

    reader = threading.Thread(target=read)
    reader.start()
    try:
        result = db_project.run("sync", "-f")
    finally:
        stop.set()
        reader.join()
    assert result.exit_code == 0, result.output
    assert errors == []
    assert seen == {50000, 50001}, "readers see the old table or the new one, nothing between"
    assert dest_conn.execute(
        sql.SQL("SELECT count(*) FROM {} WHERE id = 50001").format(view2)
    ).fetchone() == (1,)
    options = dest_conn.execute(
        "SELECT reloptions FROM pg_class WHERE oid = %s::regclass", (view.as_string(dest_conn),)
    ).fetchone()[0]
    assert options == ["security_barrier=true"]
    for obj in (orders, view2):
        assert dest_conn.execute(
            "SELECT has_table_privilege('analyst', %s, 'SELECT')", (obj.as_string(dest_conn),)
        ).fetchone() == (True,)
    assert dest_conn.execute(
        "SELECT obj_description(%s::regclass, 'pg_class'), col_description(%s::regclass, 2)",
        (orders.as_string(dest_conn),) * 2,
    ).fetchone() == ("orders copy", "in EUR")
    assert dest_conn.execute(
        "SELECT conname FROM pg_constraint WHERE conrelid = %s::regclass AND contype = 'p'",
        (orders.as_string(dest_conn),),
    ).fetchone() == ("orders_pkey",)
    leftovers = dest_conn.execute(  # this test's side tables (other tests' may be there)
        "SELECT count(*) FROM pg_tables WHERE schemaname = '_replicator' "
        "AND tablename LIKE 'new\\_%%' AND strpos(tablename, %s) > 0",
        (schema,),
    ).fetchone()
    assert leftovers == (0,)


def test_failed_table_does_not_stop_the_next(db_project, source_conn, dest_conn, schema):
    source_conn.execute(
        sql.SQL("CREATE TABLE {} (id int PRIMARY KEY, v text)").format(
            sql.Identifier(schema, "good")
        )
    )
    source_conn.execute(
        sql.SQL("INSERT INTO {} VALUES (1, 'a'), (2, 'b')").format(sql.Identifier(schema, "good"))
    )
    db_project.write_config(
        {
            "tables": [
                {"name": f"{schema}.missing", "mode": "full-refresh"},
                {"name": f"{schema}.good", "mode": "full-refresh"},
            ]
        }
    )
    result = db_project.run("sync")
    assert result.exit_code == 1
    assert re.search(
        rf"{schema}\.missing: failed after [\d.]+ s: source table does not exist", result.stderr
    ), result.stderr  # the table named once
    assert_same_table(source_conn, dest_conn, schema, "good")
    status = {r["name"]: r for r in json.loads(db_project.run("status", "--json").stdout)}
    assert status[f"{schema}.missing"]["last_status"] == "failure"
    assert status[f"{schema}.good"]["last_status"] == "success"


def test_crash_before_swap_leaves_old_table_and_next_run_cleans_up(
    db_project, source_conn, dest_conn, schema
):
    table = sql.Identifier(schema, "t")
    source_conn.execute(sql.SQL("CREATE TABLE {} (id int PRIMARY KEY, v int)").format(table))
    source_conn.execute(
        sql.SQL("INSERT INTO {} SELECT g, 1 FROM generate_series(1, 1000) g").format(table)
    )
    db_project.write_config({"tables": [{"name": f"{schema}.t", "mode": "full-refresh"}]})
    assert db_project.run("sync").exit_code == 0
    source_conn.execute(sql.SQL("UPDATE {} SET v = 2").format(table))
    killed = db_project.run_process(
        "sync", env={**IN_PROCESS, "REPLICATOR_FAILPOINT": "after-load-before-swap"}
    )
    assert killed.returncode == -9, killed.stderr
    assert dest_conn.execute(sql.SQL("SELECT DISTINCT v FROM {}").format(table)).fetchall() == [
        (1,)
    ], "the live table is untouched"
    assert leftovers(dest_conn, [TableName(schema, "t")]), "the side table is still there"
    assert db_project.run("sync").exit_code == 0
    assert_same_table(source_conn, dest_conn, schema, "t")
    assert leftovers(dest_conn, [TableName(schema, "t")]) == []


def test_a_foreign_key_to_the_copy_fails_the_swap_and_keeps_the_old_table(
    db_project, source_conn, dest_conn, schema
):
    """Views (materialized ones too) are carried across a reload: a foreign key that
    depends on the table fails that table with a message naming it, and the live table
    stays as it was."""
    dependent, named = "CREATE TABLE {s}.child (id int REFERENCES {s}.t (id))", "child"
    table = sql.Identifier(schema, "t")
    source_conn.execute(sql.SQL("CREATE TABLE {} (id int PRIMARY KEY, v int)").format(table))
    source_conn.execute(sql.SQL("INSERT INTO {} VALUES (1, 1), (2, 1)").format(table))
    db_project.write_config({"tables": [{"name": f"{schema}.t", "mode": "full-refresh"}]})
    assert db_project.run("sync").exit_code == 0
    dest_conn.execute(dependent.format(s=sql.Identifier(schema).as_string(dest_conn)))
    (oid,) = dest_conn.execute("SELECT %s::regclass::oid", (f"{schema}.t",)).fetchone()
    source_conn.execute(sql.SQL("UPDATE {} SET v = 2").format(table))
    result = db_project.run("sync")
    assert result.exit_code == 1
    assert "failed after" in result.stderr and named in result.stderr, result.stderr
    assert dest_conn.execute("SELECT %s::regclass::oid", (f"{schema}.t",)).fetchone() == (oid,)
    assert dest_conn.execute(sql.SQL("SELECT DISTINCT v FROM {}").format(table)).fetchall() == [
        (1,)
    ]
    left = leftovers(dest_conn, [TableName(schema, "t")])
    assert retired_table(TableName(schema, "t")).name not in left


def test_hostile_identifiers_load_exactly(db_project, source_conn, dest_conn):
    odd_schema = 'Odd "Schema".😀'
    name = 'Order "Lines".x select'
    ident = sql.Identifier(odd_schema, name)
    for conn in (source_conn, dest_conn):
        conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(odd_schema)))
    source_conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(odd_schema)))
    try:
        source_conn.execute(
            sql.SQL(
                'CREATE TABLE {} ("Line No" int, "UPPER" text, "sp ace" date, "select" int, '
                '"ü😀" text, PRIMARY KEY ("Line No"))'
            ).format(ident)
        )
        source_conn.execute(
            sql.SQL(
                "INSERT INTO {} SELECT g, 'U' || g, DATE '2026-01-01' + g, g, '😀' FROM "
                "generate_series(1, 500) g"
            ).format(ident)
        )
        db_project.write_config(
            {
                "tables": [
                    {
                        "name": sql.Identifier(odd_schema, name).as_string(source_conn),
                        "mode": "full-refresh",
                        "partitions": 2,
                    }
                ]
            }
        )
        result = db_project.run("sync")
        assert result.exit_code == 0, result.output
        assert assert_same_table(source_conn, dest_conn, odd_schema, name, key="Line No") == 500
    finally:
        for conn in (source_conn, dest_conn):
            conn.execute(
                sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(odd_schema))
            )


def test_copy_task_loads_its_partition_once(source_conn, dest_conn, schema, pg_servers):
    """A task that Spark runs twice (retry, speculation) must not load its rows twice."""
    from replicator.postgres.dest_schema import MARKER_DDL
    from replicator.postgres.naming import MARKER_TABLE
    from replicator.transfer.copy_stream import CopyTask, run_copy_task

    source_conn.execute(
        sql.SQL("CREATE TABLE {} AS SELECT g AS id FROM generate_series(1, 100) g").format(
            sql.Identifier(schema, "src")
        )
    )
    dest_conn.execute(sql.SQL("CREATE TABLE {} (id int)").format(sql.Identifier(schema, "dst")))
    dest_conn.execute("CREATE SCHEMA IF NOT EXISTS _replicator")
    dest_conn.execute(MARKER_DDL)
    with psycopg.connect(pg_servers.source_url, autocommit=True) as snap:
        snap.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
        (snapshot,) = snap.execute("SELECT pg_export_snapshot()").fetchone()
        task = CopyTask(
            f"test-{schema}",
            0,
            pg_servers.source_url,
            pg_servers.dest_url,
            snapshot,
            sql.SQL("COPY {} TO STDOUT (FORMAT binary)")
            .format(sql.Identifier(schema, "src"))
            .as_string(None),
            sql.SQL("COPY {} FROM STDIN (FORMAT binary)")
            .format(sql.Identifier(schema, "dst"))
            .as_string(None),
            marker=(MARKER_TABLE.schema, MARKER_TABLE.name),
        )
        first, second = run_copy_task(task), run_copy_task(task)
    assert first.rows == second.rows == 100
    assert dest_conn.execute(
        sql.SQL("SELECT count(*) FROM {}").format(sql.Identifier(schema, "dst"))
    ).fetchone() == (100,)
    assert "postgres@" not in repr(task)


def _md5_table(source_conn, schema: str, rows: int) -> None:
    """`schema.t`: `rows` rows of (id, md5(id)), loaded in full on every sync."""
    table = sql.Identifier(schema, "t")
    source_conn.execute(sql.SQL("CREATE TABLE {} (id int PRIMARY KEY, v text)").format(table))
    source_conn.execute(
        sql.SQL("INSERT INTO {} SELECT g, md5(g::text) FROM generate_series(1, %s) g").format(
            table
        ),
        (rows,),
    )


def test_unchanged_reload_keeps_row_hashes(db_project, source_conn, dest_conn, schema):
    _md5_table(source_conn, schema, 2000)
    db_project.write_config({"tables": [{"name": f"{schema}.t", "mode": "full-refresh"}]})
    assert db_project.run("sync").exit_code == 0
    first = row_hashes(dest_conn, schema, "t")
    assert db_project.run("sync").exit_code == 0
    assert row_hashes(dest_conn, schema, "t") == first


def test_a_single_partition_load_is_written_frozen(db_project, source_conn, dest_conn, schema):
    """One task may empty the side table in its own transaction and COPY FREEZE: every page
    of the loaded table is all-visible at once (nothing for vacuum or the key build to set)."""
    _md5_table(source_conn, schema, 20000)
    db_project.write_config({"tables": [{"name": f"{schema}.t", "mode": "full-refresh"}]})
    for _ in range(2):  # a first load, then a reload into a fresh side table
        assert db_project.run("sync").exit_code == 0
        visible, pages = dest_conn.execute(
            "SELECT relallvisible, relpages FROM pg_class WHERE oid = %s::regclass",
            (sql.Identifier(schema, "t").as_string(dest_conn),),
        ).fetchone()
        assert pages > 0 and visible == pages
        assert_same_table(source_conn, dest_conn, schema, "t")


def test_cursor_text_ignores_server_and_tool_settings(db_project, source_conn, schema):
    """Odd server defaults (DateStyle, TimeZone, ...) and the tool's TZ never change the
    stored cursor: the sessions pin every setting that changes text output."""
    table = sql.Identifier(schema, "events")
    source_conn.execute(
        sql.SQL("CREATE TABLE {} (id int PRIMARY KEY, at timestamptz NOT NULL)").format(table)
    )
    source_conn.execute(
        sql.SQL(
            "INSERT INTO {} VALUES (1, '2026-11-20 10:00:00.123456+00'), "
            "(2, '2026-11-20 11:30:00.000001+00')"
        ).format(table)
    )
    settings = {
        "DateStyle": "SQL, DMY",
        "TimeZone": "Asia/Kolkata",
        "IntervalStyle": "sql_standard",
        "extra_float_digits": "-3",
    }
    for name, value in settings.items():
        source_conn.execute(
            sql.SQL("ALTER DATABASE postgres SET {} = {}").format(
                sql.Identifier(name), sql.Literal(value)
            )
        )
    try:
        db_project.write_config(
            {"tables": [{"name": f"{schema}.events", "replication_key": "at", "lookback": 0}]}
        )
        result = db_project.run("sync", env={"TZ": "Pacific/Auckland"})
        assert result.exit_code == 0, result.output
    finally:
        for name in settings:
            source_conn.execute(
                sql.SQL("ALTER DATABASE postgres RESET {}").format(sql.Identifier(name))
            )
    state = json.loads(db_project.run("state", "show").stdout)[f"{schema}.events"]
    assert state["cursor"] == {
        "value": "2026-11-20 11:30:00.000001+00",
        "type": "timestamp with time zone",
    }
