"""Incremental syncs against real clusters: nothing committed is ever missed or duplicated."""

from __future__ import annotations

import json
import re
import subprocess
import time

import psycopg
import pytest
from dbcompare import assert_same_table
from engines import IN_PROCESS
from psycopg import sql

from replicator.base.identifiers import TableName
from replicator.plan.cursor import newest_key
from replicator.plan.table_sql import batch_query
from replicator.postgres.naming import staging_table
from replicator.sync.incremental.batch import _split_batch

pytestmark = pytest.mark.spark


def _orders(source_conn, schema, rows=2000, index=True):
    table = sql.Identifier(schema, "orders")
    source_conn.execute(
        sql.SQL(
            "CREATE TABLE {} (id bigint PRIMARY KEY, amount numeric(12,2), note text, "
            "doc json, updated_at timestamptz NOT NULL DEFAULT clock_timestamp())"
        ).format(table)
    )
    if index:
        source_conn.execute(sql.SQL("CREATE INDEX ON {} (updated_at)").format(table))
    source_conn.execute(
        sql.SQL(
            "INSERT INTO {} (id, amount, note, doc) SELECT g, g / 3.0, 'n' || g, '{{\"g\": 1}}' "
            "FROM generate_series(1, %s) g"
        ).format(table),
        (rows,),
    )
    return table


def _state(project, name):
    return json.loads(project.run("state", "show", name).stdout)[name]


def test_updates_and_inserts_are_merged(db_project, source_conn, dest_conn, schema):
    table = _orders(source_conn, schema)
    db_project.configure(schema, "orders", replication_key="updated_at")
    assert db_project.run("sync").exit_code == 0
    source_conn.execute(
        sql.SQL(
            "UPDATE {} SET amount = amount + 1, updated_at = clock_timestamp() WHERE id % 10 = 0"
        ).format(table)
    )
    source_conn.execute(
        sql.SQL(
            "INSERT INTO {} (id, amount, note) SELECT g, 1, 'new' "
            "FROM generate_series(2001, 2100) g"
        ).format(table)
    )
    result = db_project.run("sync")
    assert result.exit_code == 0, result.output
    assert f"{schema}.orders: incremental, " in result.stderr
    assert "reason: cursor " in result.stderr and " -> " in result.stderr
    assert assert_same_table(source_conn, dest_conn, schema, "orders") == 2100
    assert _state(db_project, f"{schema}.orders")["last_run"]["action"] == "incremental"


DUPLICATING_MODEL = """
SELECT id, amount, note, doc, updated_at FROM {source}
UNION ALL SELECT id, amount, 'older', doc, updated_at - interval '1 microsecond' FROM {source}
UNION ALL SELECT id, amount, 'tie ' || note, doc, updated_at FROM {source} WHERE id % 2 = 0
"""


def test_a_batch_with_a_key_twice_merges_the_newest_version(
    db_project, source_conn, dest_conn, schema
):
    """A model that emits every key up to three times (an older version, and a tie on the
    replication key): the merge keeps the highest replication key, breaks the tie the same
    way every time, and a replay of the batch changes nothing. A full reload of the same
    model keeps the same version of every key."""
    table = _orders(source_conn, schema, rows=200)
    db_project.configure(schema, "orders", replication_key="updated_at")
    db_project.write(f"models/{schema}/orders.sql", DUPLICATING_MODEL.format(source="{{ source }}"))
    assert db_project.run("sync").exit_code == 0
    source_conn.execute(
        sql.SQL(
            "UPDATE {} SET amount = 0, updated_at = clock_timestamp() WHERE id % 10 = 0"
        ).format(table)
    )
    result = db_project.run("sync")
    assert result.exit_code == 0, result.output
    assert f"{schema}.orders: incremental, " in result.stderr
    model = DUPLICATING_MODEL.format(source=table.as_string(source_conn))
    expected = dict(
        source_conn.execute(
            f"SELECT DISTINCT ON (id) id, md5(m::text) FROM ({model}) m "
            "ORDER BY id, updated_at DESC, m::text DESC"
        ).fetchall()
    )
    got = dict(dest_conn.execute(sql.SQL("SELECT id, md5(t::text) FROM {} t").format(table)))
    changed = {k for k in expected if k % 10 == 0}
    assert {k: got[k] for k in changed} == {k: expected[k] for k in changed}
    (older,) = dest_conn.execute(
        sql.SQL("SELECT count(*) FROM {} WHERE note = 'older'").format(table)
    ).fetchone()
    assert older == 0
    before = dest_conn.execute(sql.SQL("SELECT id, xmin::text FROM {}").format(table)).fetchall()
    replay = db_project.run("sync", "--since", "2000-01-01", "-s", f"{schema}.orders")
    assert replay.exit_code == 0, replay.output
    after = dest_conn.execute(sql.SQL("SELECT id, xmin::text FROM {}").format(table)).fetchall()
    assert sorted(after) == sorted(before)
    reload = db_project.run("sync", "-f")  # a full reload keeps the same version of each key
    assert reload.exit_code == 0, reload.output
    assert "kept the newest version of each key" in reload.stderr
    got = dict(dest_conn.execute(sql.SQL("SELECT id, md5(t::text) FROM {} t").format(table)))
    assert got == expected


def test_unchanged_source_is_a_noop_without_a_jvm(db_project, source_conn, dest_conn, schema):
    """A JAVA_HOME that cannot work proves no JVM is started: a no-op succeeds, and the
    same run with one changed row fails because it needs Spark."""
    table = _orders(source_conn, schema)
    db_project.configure(schema, "orders", replication_key="updated_at")
    assert db_project.run("sync").exit_code == 0
    no_java = {"JAVA_HOME": "/nonexistent", "PATH": "/usr/local/sbin:/nonexistent"}
    noop = db_project.run_process("sync", env={"JAVA_HOME": "/nonexistent"})
    assert noop.returncode == 0, noop.stderr
    assert f"{schema}.orders: noop" in noop.stderr
    assert _state(db_project, f"{schema}.orders")["last_run"]["action"] == "noop"
    source_conn.execute(
        sql.SQL("UPDATE {} SET note = 'x', updated_at = clock_timestamp() WHERE id = 1").format(
            table
        )
    )
    needs_spark = db_project.run_process("sync", env=no_java)
    assert needs_spark.returncode == 1
    assert "Spark did not start" in needs_spark.stderr


def test_replaying_a_batch_changes_no_destination_row(db_project, source_conn, dest_conn, schema):
    _orders(source_conn, schema)
    db_project.configure(schema, "orders", replication_key="updated_at")
    assert db_project.run("sync").exit_code == 0
    before = dest_conn.execute(
        sql.SQL("SELECT id, xmin::text FROM {} ORDER BY id").format(
            sql.Identifier(schema, "orders")
        )
    ).fetchall()
    assert (
        db_project.run(
            "state", "set-cursor", f"{schema}.orders", "2000-01-01 00:00:00+00"
        ).exit_code
        == 0
    )
    result = db_project.run("sync")
    assert result.exit_code == 0, result.output
    assert f"{schema}.orders: incremental, 2,000 rows" in result.stderr
    after = dest_conn.execute(
        sql.SQL("SELECT id, xmin::text FROM {} ORDER BY id").format(
            sql.Identifier(schema, "orders")
        )
    ).fetchall()
    assert after == before, "an idempotent merge rewrites no unchanged row"


def test_rows_tied_with_the_cursor_are_not_lost(db_project, source_conn, dest_conn, schema):
    table = _orders(source_conn, schema, rows=10)
    source_conn.execute(
        sql.SQL("UPDATE {} SET updated_at = '2026-11-20 10:00:00+00'").format(table)
    )
    db_project.configure(schema, "orders", replication_key="updated_at", lookback=0)
    assert db_project.run("sync").exit_code == 0
    assert _state(db_project, f"{schema}.orders")["cursor"]["value"] == "2026-11-20 10:00:00+00"
    source_conn.execute(
        sql.SQL(
            "INSERT INTO {} (id, note, updated_at) VALUES (11, 'tie', '2026-11-20 10:00:00+00')"
        ).format(table)
    )
    assert db_project.run("sync").exit_code == 0
    assert_same_table(source_conn, dest_conn, schema, "orders")


def test_a_row_rewritten_at_the_cursor_is_seen_by_a_table_probed_alone(
    db_project, source_conn, dest_conn, schema
):
    """Every row shares the cursor's key (a table loaded at once), so the window the sync
    records holds them all. A row rewritten in place keeps the count and the newest key:
    only the window's hash tells, here on the probe of a table the run's screen leaves
    alone (`deletes`); the run after reads nothing (the recorded hash is the probe's)."""
    table = _orders(source_conn, schema, rows=50)
    source_conn.execute(
        sql.SQL("UPDATE {} SET updated_at = '2026-11-20 10:00:00+00'").format(table)
    )
    db_project.configure(
        schema, "orders", replication_key="updated_at", lookback=0, deletes="delete"
    )
    assert db_project.run("sync").exit_code == 0
    source_conn.execute(sql.SQL("UPDATE {} SET note = 'rewritten' WHERE id = 7").format(table))
    result = db_project.run("sync")
    assert result.exit_code == 0, result.output
    assert f"{schema}.orders: incremental, " in result.stderr, result.stderr
    assert_same_table(source_conn, dest_conn, schema, "orders")
    again = db_project.run("sync")
    assert f"{schema}.orders: noop" in again.stderr, again.stderr


def test_the_newest_key_is_read_at_the_index_end_after_a_burst_of_writes(source_conn, schema):
    """Right after a burst of writes the statistics put about one row past the cursor; the
    batch's newest key must still come from the index's last entry, not from a pass over
    the whole batch (5,000 heap fetches here, 0.3-0.5 s for a 1% batch of 5M rows). A row
    with a NULL key (which a sync also reads: incremental.batch_for) is never the newest."""
    table = sql.Identifier(schema, "events")
    source_conn.execute(
        sql.SQL("CREATE TABLE {} (id int PRIMARY KEY, k timestamptz)").format(table)
    )
    source_conn.execute(sql.SQL("CREATE INDEX ON {} (k)").format(table))
    source_conn.execute(
        sql.SQL(
            "INSERT INTO {} SELECT g, now() - interval '60 days' + g * interval '1 min' "
            "FROM generate_series(1, 20000) g"
        ).format(table)
    )
    source_conn.execute(sql.SQL("ANALYZE {}").format(table))
    source_conn.execute(
        sql.SQL(
            "INSERT INTO {} SELECT g, now() + g * interval '1 ms' "
            "FROM generate_series(20001, 25000) g"
        ).format(table)
    )
    source_conn.execute(sql.SQL("INSERT INTO {} VALUES (25001, NULL)").format(table))
    since = source_conn.execute("SELECT now()::text").fetchone()[0]
    batch = batch_query(f"SELECT * FROM {schema}.events", "k", "timestamptz", since)
    fetched = sql.SQL(
        "SELECT idx_tup_fetch + coalesce(seq_tup_read, 0) FROM pg_stat_xact_user_tables "
        "WHERE relid = {}::regclass"
    ).format(sql.Literal(f"{schema}.events"))
    with source_conn.transaction():
        (before,) = source_conn.execute(fetched).fetchone()
        newest = newest_key(source_conn, batch, "k", "timestamp with time zone")
        (after,) = source_conn.execute(fetched).fetchone()
        # A batch copied in key ranges (Spark's tasks, or parts merged as they land) finds
        # its two ends the same way.
        ranges = _split_batch(source_conn, batch, batch, "k", "timestamp with time zone", 4)
        (split,) = source_conn.execute(fetched).fetchone()
    (expected,) = source_conn.execute(
        sql.SQL("SELECT max(k)::text FROM {}").format(table)
    ).fetchone()
    assert newest == expected
    assert after - before < 100, f"{after - before} rows read for the newest key"
    assert len(ranges) == 4
    assert split - after < 100, f"{split - after} rows read for the batch's ends"


@pytest.mark.parametrize(
    ("key_type", "far", "now"),
    [
        ("timestamptz", "infinity", "clock_timestamp()"),
        ("numeric", "NaN", "extract(epoch FROM clock_timestamp())"),
        ("double precision", "Infinity", "extract(epoch FROM clock_timestamp())"),
        ("moment", "infinity", "clock_timestamp()"),  # a domain over timestamptz
    ],
)
def test_a_key_at_infinity_never_becomes_the_cursor(
    db_project, source_conn, dest_conn, schema, key_type, far, now
):
    """A row keyed `infinity` (or NaN) is at or past any cursor: read by every run, as a row
    at the cursor is. The cursor never becomes it (every later row would be below it)."""
    table = sql.Identifier(schema, "events")
    if key_type == "moment":  # the key's type as the catalog prints a domain's name
        source_conn.execute(
            sql.SQL("CREATE DOMAIN {} AS timestamptz").format(sql.Identifier(schema, "moment"))
        )
        key_type = f"{schema}.moment"
    source_conn.execute(
        sql.SQL(f"CREATE TABLE {{}} (id int PRIMARY KEY, note text, k {key_type})").format(table)
    )
    source_conn.execute(
        sql.SQL(f"INSERT INTO {{}} SELECT g, 'n', {now} FROM generate_series(1, 5) g").format(table)
    )
    entry = {"name": f"{schema}.events", "replication_key": "k", "partitions": 3}  # split
    db_project.write_config({"tables": [entry]})
    assert db_project.run("sync", env=IN_PROCESS).exit_code == 0
    source_conn.execute(sql.SQL("INSERT INTO {} VALUES (6, 'far', %s)").format(table), (far,))
    assert db_project.run("sync", env=IN_PROCESS).exit_code == 0
    cursor = _state(db_project, f"{schema}.events")["cursor"]["value"]
    assert cursor.lower() not in ("infinity", "nan"), cursor
    source_conn.execute(
        sql.SQL(f"UPDATE {{}} SET note = 'later', k = {now} WHERE id = 1").format(table)
    )
    source_conn.execute(sql.SQL(f"INSERT INTO {{}} VALUES (7, 'new', {now})").format(table))
    assert db_project.run("sync", env=IN_PROCESS).exit_code == 0
    if far == "infinity":  # a temporal key (a domain's too) keeps the lookback's margin
        cursor = _state(db_project, f"{schema}.events")["cursor"]["value"]
        (margin,) = source_conn.execute(
            sql.SQL("SELECT max(k) FILTER (WHERE isfinite(k)) - %s::timestamptz FROM {}").format(
                table
            ),
            (cursor,),
        ).fetchone()
        assert margin.total_seconds() >= 5, (cursor, margin)  # the default lookback
    # A batch cut in key ranges (Spark's tasks) spans the finite keys; the far one is in the
    # last, open range: every row in exactly one range.
    rows = sql.SQL("SELECT * FROM {}").format(table)
    ranges = _split_batch(source_conn, rows, rows, "k", key_type, 3)
    assert len(ranges) == (1 if key_type == "double precision" else 3)  # floats: one range
    ids = sorted(
        i
        for r in ranges
        for (i,) in source_conn.execute(sql.SQL("SELECT id FROM ({}) AS p").format(r))
    )
    assert ids == list(range(1, 8))
    assert_same_table(source_conn, dest_conn, schema, "events")
    status = json.loads(db_project.run("status", "--json", env=IN_PROCESS).stdout)[0]
    assert status["next_action"] == "incremental", status
    # A cursor an older version stored at the far key: the next sync reloads, saying why.
    path = db_project.path / "sync-state" / f"{schema}.events.json"
    document = json.loads(path.read_text())
    document["cursor"]["value"] = far
    path.write_text(json.dumps(document))
    healed = db_project.run("sync", env=IN_PROCESS)
    assert healed.exit_code == 0 and f"cursor {far}: no later row could be read" in healed.stderr
    assert_same_table(source_conn, dest_conn, schema, "events")


def test_late_commit_with_older_timestamp_is_not_lost(
    db_project, source_conn, dest_conn, schema, pg_servers
):
    """A transaction that began before a sync and commits after it, with an updated_at from
    its start, is present after the next sync."""
    table = _orders(source_conn, schema, rows=100)
    db_project.configure(schema, "orders", replication_key="updated_at", lookback=0)
    assert db_project.run("sync").exit_code == 0
    late = psycopg.connect(pg_servers.source_url)
    try:
        late.execute(
            sql.SQL("INSERT INTO {} (id, note, updated_at) VALUES (500, 'late', now())").format(
                table
            )
        )
        time.sleep(0.2)
        source_conn.execute(
            sql.SQL(
                "UPDATE {} SET note = 'later', updated_at = clock_timestamp() WHERE id = 1"
            ).format(table)
        )
        assert db_project.run("sync").exit_code == 0
        late.commit()
    finally:
        late.close()
    assert db_project.run("sync").exit_code == 0
    assert_same_table(source_conn, dest_conn, schema, "orders")


def test_late_commit_of_an_earlier_sequence_value_is_not_lost(
    db_project, source_conn, dest_conn, schema, pg_servers
):
    """Integer keys: an id drawn by a transaction that commits after a sync which already
    saw a higher id is present after the next sync."""
    table = sql.Identifier(schema, "events")
    source_conn.execute(
        sql.SQL(
            "CREATE TABLE {} (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, v text)"
        ).format(table)
    )
    source_conn.execute(
        sql.SQL("INSERT INTO {} (v) SELECT 'a' FROM generate_series(1, 50)").format(table)
    )
    db_project.write_config({"tables": [{"name": f"{schema}.events", "replication_key": "id"}]})
    assert db_project.run("sync").exit_code == 0
    late = psycopg.connect(pg_servers.source_url)
    try:
        late.execute(sql.SQL("INSERT INTO {} (v) VALUES ('late')").format(table))  # id 51
        source_conn.execute(sql.SQL("INSERT INTO {} (v) VALUES ('b')").format(table))  # id 52
        assert db_project.run("sync").exit_code == 0
        state = _state(db_project, f"{schema}.events")
        assert state["cursor"]["value"] == "50" and state["pending"]["value"] == "52"
        late.commit()
    finally:
        late.close()
    assert db_project.run("sync").exit_code == 0
    assert_same_table(source_conn, dest_conn, schema, "events")
    assert _state(db_project, f"{schema}.events")["cursor"]["value"] == "52"


def test_indexed_source_is_never_scanned_sequentially(db_project, source_conn, schema):
    table = _orders(source_conn, schema, rows=20000)
    # Rows written over the last day, as in a real table (not all within the lookback).
    source_conn.execute(
        sql.SQL("UPDATE {} SET updated_at = now() - interval '1 day' + id * interval '1 s'").format(
            table
        )
    )
    source_conn.execute(sql.SQL("ANALYZE {}").format(table))
    db_project.configure(schema, "orders", replication_key="updated_at")
    assert db_project.run("sync").exit_code == 0

    def seq_scans() -> int:
        source_conn.execute("SELECT pg_stat_clear_snapshot()")
        return source_conn.execute(
            "SELECT seq_scan FROM pg_stat_user_tables WHERE relid = %s::regclass",
            (table.as_string(source_conn),),
        ).fetchone()[0]

    time.sleep(1.1)
    before = seq_scans()
    source_conn.execute(
        sql.SQL("UPDATE {} SET note = 'x', updated_at = clock_timestamp() WHERE id <= 20").format(
            table
        )
    )
    result = db_project.run("sync")
    assert result.exit_code == 0 and "incremental, " in result.stderr, result.output
    assert db_project.run("sync").exit_code == 0  # and a no-op probe
    time.sleep(1.1)
    assert seq_scans() == before


def test_kill_after_merge_before_state_write_converges(db_project, source_conn, dest_conn, schema):
    table = _orders(source_conn, schema, rows=500)
    db_project.configure(schema, "orders", replication_key="updated_at")
    assert db_project.run("sync").exit_code == 0
    source_conn.execute(
        sql.SQL("UPDATE {} SET note = 'k', updated_at = clock_timestamp() WHERE id % 7 = 0").format(
            table
        )
    )
    killed = db_project.run_process(
        "sync", env={**IN_PROCESS, "REPLICATOR_FAILPOINT": "after-merge-before-state"}
    )
    assert killed.returncode == -9
    assert db_project.run("sync").exit_code == 0
    assert_same_table(source_conn, dest_conn, schema, "orders")
    staging = staging_table(TableName(schema, "orders"))
    assert dest_conn.execute(
        "SELECT count(*) FROM pg_tables WHERE schemaname = %s AND tablename = %s",
        (staging.schema, staging.name),
    ).fetchone() == (0,)


def test_small_copies_run_in_process_without_a_jvm(db_project, source_conn, dest_conn, schema):
    """With spark.min_rows unset, small full loads and batches are copied by the replicator
    process itself (spark/engine_choice.py): a JAVA_HOME that cannot work does not
    matter."""
    table = _orders(source_conn, schema, rows=300)
    db_project.configure(schema, "orders", replication_key="updated_at")

    def run() -> subprocess.CompletedProcess[str]:
        return db_project.run_process(
            "sync", env={"JAVA_HOME": "/nonexistent"}, drop=("REPLICATOR_SPARK_MIN_ROWS",)
        )

    first = run()
    assert first.returncode == 0, first.stderr
    assert f"{schema}.orders: full_reload, 300 rows" in first.stderr
    source_conn.execute(
        sql.SQL(
            "UPDATE {} SET note = 'small', updated_at = clock_timestamp() WHERE id <= 3"
        ).format(table)
    )
    second = run()
    assert second.returncode == 0, second.stderr
    assert f"{schema}.orders: incremental, " in second.stderr
    assert_same_table(source_conn, dest_conn, schema, "orders")


def test_status_shows_the_source_newest_key_and_lag(db_project, source_conn, schema):
    table = _orders(source_conn, schema, rows=50)
    events = sql.Identifier(schema, "events")
    source_conn.execute(
        sql.SQL(
            "CREATE TABLE {} (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, v text)"
        ).format(events)
    )
    source_conn.execute(
        sql.SQL("INSERT INTO {} (v) SELECT 'a' FROM generate_series(1, 10)").format(events)
    )
    db_project.write_config(
        {
            "tables": [
                {"name": f"{schema}.orders", "replication_key": "updated_at"},
                {"name": f"{schema}.events", "replication_key": "id"},
            ]
        }
    )
    assert db_project.run("sync").exit_code == 0
    rows = {r["name"]: r for r in json.loads(db_project.run("status", "--json").stdout)}
    assert rows[f"{schema}.orders"]["lag"] == "00:00:00", "not the 5 s the cursor stays behind"
    assert rows[f"{schema}.events"]["lag"] == "0"
    source_conn.execute(sql.SQL("INSERT INTO {} (v) VALUES ('b'), ('c'), ('d')").format(events))
    source_conn.execute(
        sql.SQL("UPDATE {} SET updated_at = updated_at + interval '1 hour' WHERE id = 1").format(
            table
        )
    )
    rows = {r["name"]: r for r in json.loads(db_project.run("status", "--json").stdout)}
    assert rows[f"{schema}.events"]["lag"] == "3"
    assert rows[f"{schema}.events"]["source_max"] == "13"
    assert rows[f"{schema}.orders"]["lag"].startswith(("00:59:59", "01:00:00"))
    offline = db_project.run("status", env={"REPLICATOR_SOURCE_URL": None})
    assert offline.exit_code == 0
    assert "source not inspected: REPLICATOR_SOURCE_URL is not set" in offline.stdout


def _events(source_conn, schema, key=True):
    table = sql.Identifier(schema, "events")
    key_sql = "GENERATED ALWAYS AS IDENTITY PRIMARY KEY" if key else ""
    source_conn.execute(
        sql.SQL("CREATE TABLE {} (id bigint " + key_sql + ", v text)").format(table)
    )
    if not key:
        source_conn.execute(sql.SQL("CREATE SEQUENCE {}").format(sql.Identifier(schema, "s")))
    source_conn.execute(
        sql.SQL("INSERT INTO {} (v) SELECT 'a' FROM generate_series(1, 100)").format(table)
    )
    return table


def test_append_adds_each_row_once_and_never_updates(db_project, source_conn, dest_conn, schema):
    table = _events(source_conn, schema)
    db_project.write_config(
        {
            "tables": [
                {"name": f"{schema}.events", "replication_key": "id", "mode": "incremental-append"}
            ]
        }
    )
    assert db_project.run("sync").exit_code == 0
    source_conn.execute(
        sql.SQL("INSERT INTO {} (v) SELECT 'b' FROM generate_series(1, 50)").format(table)
    )
    source_conn.execute(sql.SQL("UPDATE {} SET v = 'changed' WHERE id = 100").format(table))
    killed = db_project.run_process(
        "sync", env={**IN_PROCESS, "REPLICATOR_FAILPOINT": "after-merge-before-state"}
    )
    assert killed.returncode == -9
    result = db_project.run("sync")  # reads the same rows again from the old cursor
    assert result.exit_code == 0, result.output
    assert f"{schema}.events: incremental, " in result.stderr
    counts = dest_conn.execute(
        sql.SQL(
            "SELECT count(*), count(DISTINCT id), max(id), "
            "(SELECT v FROM {t} WHERE id = 100) FROM {t}"
        ).format(t=table)
    ).fetchone()
    assert counts == (150, 150, 150, "a"), "appended once; an appended row is never updated"


def test_append_without_a_key_fails_with_the_fix(db_project, source_conn, schema):
    _events(source_conn, schema, key=False)
    db_project.write_config(
        {
            "tables": [
                {"name": f"{schema}.events", "replication_key": "id", "mode": "incremental-append"}
            ]
        }
    )
    result = db_project.run("sync")
    assert result.exit_code == 1
    assert (
        "the source table has no primary key, which mode incremental-append needs" in result.stderr
    )


def test_large_batch_is_read_in_key_ranges(db_project, source_conn, dest_conn, schema):
    table = _orders(source_conn, schema, rows=3000)
    source_conn.execute(
        sql.SQL(
            "UPDATE {} SET note = 'old', "
            "updated_at = now() - interval '1 day' + id * interval '1 s'"
        ).format(table)
    )
    db_project.configure(schema, "orders", replication_key="updated_at", partitions=3)
    assert db_project.run("sync").exit_code == 0
    source_conn.execute(
        sql.SQL(
            "UPDATE {} SET note = 'ranged', amount = -amount, "
            "updated_at = clock_timestamp() + id * interval '1 ms' WHERE id % 3 = 0"
        ).format(table)
    )

    def markers() -> int:
        return dest_conn.execute("SELECT count(*) FROM _replicator.loaded_partitions").fetchone()[0]

    markers_before = markers()
    result = db_project.run("sync", "-v")
    assert result.exit_code == 0, result.output
    assert re.search(r"incremental, 1,00\d rows", result.stderr)  # + the lookback
    assert "batch of 1,00" not in result.stderr  # (the log line counts without separators)
    assert re.search(r"batch of 100\d row\(s\) read in 3 partition\(s\) on Spark", result.stderr)
    assert_same_table(source_conn, dest_conn, schema, "orders")
    assert markers() == markers_before, "no partition marker is left behind"


@pytest.mark.parametrize("mode", ["incremental", "cdc"])
def test_a_destination_switched_back_to_an_older_copy_is_reloaded(
    db_project, source_conn, dest_conn, schema, mode
):
    """The config's destination moves to another table and back: the older copy missed
    what the other one took meanwhile, and the cursor is the other one's. It is reloaded."""
    table = sql.Identifier(schema, "events")
    source_conn.execute(
        sql.SQL(
            "CREATE TABLE {} (id int PRIMARY KEY, note text, "
            "updated_at timestamptz NOT NULL DEFAULT clock_timestamp())"
        ).format(table)
    )
    source_conn.execute(sql.SQL("INSERT INTO {} (id, note) VALUES (1, 'a')").format(table))
    key = {"replication_key": "updated_at"} if mode == "incremental" else {"mode": "cdc"}

    def sync_into(name: str):
        entry = {"name": f"{schema}.events", "destination": f"{schema}.{name}", **key}
        db_project.write_config({"tables": [entry]})
        result = db_project.run("sync", env=IN_PROCESS)
        assert result.exit_code == 0, result.output
        return result

    sync_into("first")
    sync_into("second")
    source_conn.execute(sql.SQL("INSERT INTO {} (id, note) VALUES (2, 'b')").format(table))
    source_conn.execute(
        sql.SQL("UPDATE {} SET note = 'a2', updated_at = clock_timestamp() WHERE id = 1").format(
            table
        )
    )
    sync_into("second")
    back = sync_into("first")
    assert "destination table replaced" in back.stderr, back.stderr
    rows = sql.SQL("SELECT id, note FROM {} ORDER BY id")
    wanted = source_conn.execute(rows.format(table)).fetchall()
    assert dest_conn.execute(rows.format(sql.Identifier(schema, "first"))).fetchall() == wanted
    again = sync_into("first")  # the copy is the state's own again
    assert "destination table replaced" not in again.stderr, again.stderr


def test_a_batch_with_a_configured_key_twice_says_it_kept_the_newest(
    db_project, source_conn, dest_conn, schema
):
    """A keyless source with `primary_key` in the config: two rows of one batch on one key
    are one row in the copy (the newest), and the sync says so, as a full load does."""
    table = sql.Identifier(schema, "log")
    source_conn.execute(
        sql.SQL("CREATE TABLE {} (id int, note text, updated_at timestamptz NOT NULL)").format(
            table
        )
    )
    source_conn.execute(sql.SQL("INSERT INTO {} VALUES (1, 'a', now())").format(table))
    entry = {"name": f"{schema}.log", "replication_key": "updated_at", "primary_key": ["id"]}
    db_project.write_config({"tables": [entry]})
    assert db_project.run("sync", env=IN_PROCESS).exit_code == 0
    source_conn.execute(
        sql.SQL(
            "INSERT INTO {} VALUES (2, 'older', now() + interval '1 minute'), "
            "(2, 'newer', now() + interval '2 minutes')"
        ).format(table)
    )
    synced = db_project.run("sync", env=IN_PROCESS)
    assert synced.exit_code == 0, synced.output
    assert (
        "returned 1 row(s) whose primary key another row also has; kept the newest version of "
        "each key (`replicator verify` names the keys)" in synced.stderr
    )
    copied = dest_conn.execute(sql.SQL("SELECT id, note FROM {} ORDER BY id").format(table))
    assert copied.fetchall() == [(1, "a"), (2, "newer")]


def test_a_primary_key_with_included_columns_keys_the_copy_by_its_key_columns(
    db_project, source_conn, dest_conn, schema
):
    """`PRIMARY KEY (id) INCLUDE (note)`: the index's INCLUDE columns are not the key. Read as
    (id, note), the copy's key let an updated note arrive as a second row of its id."""
    table = sql.Identifier(schema, "orders")
    source_conn.execute(
        sql.SQL(
            "CREATE TABLE {} (id bigint, note text NOT NULL, "
            "updated_at timestamptz NOT NULL DEFAULT clock_timestamp(), "
            "PRIMARY KEY (id) INCLUDE (note))"
        ).format(table)
    )
    source_conn.execute(
        sql.SQL("INSERT INTO {} (id, note) SELECT g, 'n' FROM generate_series(1, 20) g").format(
            table
        )
    )
    db_project.configure(schema, "orders", replication_key="updated_at")
    assert db_project.run("sync", env=IN_PROCESS).exit_code == 0
    source_conn.execute(
        sql.SQL(
            "UPDATE {} SET note = 'changed', updated_at = clock_timestamp() WHERE id <= 5"
        ).format(table)
    )
    result = db_project.run("sync", env=IN_PROCESS)
    assert result.exit_code == 0, result.output
    assert assert_same_table(source_conn, dest_conn, schema, "orders") == 20


def test_a_unique_index_comparing_otherwise_than_its_column_does_not_key_the_copy(
    db_project, source_conn, dest_conn, schema
):
    """`UNIQUE (name COLLATE "C")` over a case-insensitive column holds 'Bob' and 'bob'; the
    copy's key, made with the column's collation, took them for one row: 'bob' overwrote
    'Bob', exit 0. Such an index keys nothing: the table has no key, and says so."""
    collation = sql.Identifier(schema, "ci")
    source_conn.execute(
        sql.SQL(
            "CREATE COLLATION {} (provider = icu, locale = 'und-u-ks-level2', "
            "deterministic = false)"
        ).format(collation)
    )
    table = sql.Identifier(schema, "orders")
    source_conn.execute(
        sql.SQL(
            "CREATE TABLE {} (name text COLLATE {} NOT NULL, note text, "
            "updated_at timestamptz NOT NULL DEFAULT clock_timestamp())"
        ).format(table, collation)
    )
    source_conn.execute(sql.SQL('CREATE UNIQUE INDEX ON {} (name COLLATE "C")').format(table))
    source_conn.execute(sql.SQL("INSERT INTO {} VALUES ('Bob', 'n1')").format(table))
    db_project.configure(schema, "orders", replication_key="updated_at")
    refused = db_project.run("sync", env=IN_PROCESS)
    assert refused.exit_code == 1, refused.output
    assert (
        "no unique index over NOT NULL columns (valid, not partial, not on expressions, "
        "comparing values as its columns do)" in refused.stderr
    )
