"""`replicator verify`: a copy proven equal, or exactly its differing rows found, and with
--repair fixed (only those rows written; cursors untouched). Both real servers, and Spark
for the first pass (the suite's REPLICATOR_SPARK_MIN_ROWS=0)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading

import psycopg
import pytest
from dbcompare import assert_same_table
from engines import IN_PROCESS
from psycopg import sql
from waiting import wait_for

from replicator.base.identifiers import TableName, quote_ident
from replicator.postgres.pgcluster import free_port
from replicator.project.templates import Templates

pytestmark = pytest.mark.spark


def _orders(conn, schema, rows=10_000, table="orders"):
    """Orders with distinct, increasing update times, all in the past."""
    target = sql.Identifier(schema, table)
    conn.execute(
        sql.SQL(
            "CREATE TABLE {} (id bigint PRIMARY KEY, note text, amount numeric(10,2), "
            "updated_at timestamptz NOT NULL)"
        ).format(target)
    )
    conn.execute(
        sql.SQL(
            "INSERT INTO {} SELECT g, 'note ' || g, g / 100.0, "
            "now() - interval '30 days' + g * interval '1 second' FROM generate_series(1, %s) g"
        ).format(target),
        (rows,),
    )


def _verify(project, *args, env=None):
    result = project.run("verify", "--json", *args, env=env)
    return result, {v["name"]: v for v in json.loads(result.stdout)}


def _xmins(conn, schema, table="orders"):
    return dict(
        conn.execute(
            sql.SQL("SELECT id, xmin::text FROM {}").format(sql.Identifier(schema, table))
        ).fetchall()
    )


def _tamper(dest_conn, schema):
    """Two rows changed, two deleted, two added, in the destination."""
    dest_conn.execute(
        sql.SQL(
            "UPDATE {t} SET note = 'tampered' WHERE id IN (17, 5003); "
            "DELETE FROM {t} WHERE id IN (2, 8000); "
            "INSERT INTO {t} VALUES (2000000, 'extra', 1, now() - interval '40 days'), "
            "(-5, 'extra', 1, now() - interval '40 days')"
        ).format(t=sql.Identifier(schema, "orders"))
    )


def test_a_synced_copy_is_equal(db_project, schema, source_conn):
    _orders(source_conn, schema)
    db_project.write_config(
        {"tables": [{"name": f"{schema}.orders", "replication_key": "updated_at"}]}
    )
    assert db_project.run("sync").exit_code == 0
    result, verdicts = _verify(db_project)
    assert result.exit_code == 0, result.output
    verdict = verdicts[f"{schema}.orders"]
    assert verdict["status"] == "equal"
    assert verdict["rows_compared"] == 10_000
    assert (verdict["missing"], verdict["extra"], verdict["different"]) == (0, 0, 0)
    assert verdict["examples"] == []


def test_a_tampered_destination_is_found_and_repaired_row_by_row(
    db_project, schema, source_conn, dest_conn, httpserver
):
    _orders(source_conn, schema)
    db_project.write_config(
        {"tables": [{"name": f"{schema}.orders", "replication_key": "updated_at"}]}
    )
    assert db_project.run("sync").exit_code == 0
    state_before = (db_project.path / "sync-state").glob("*.json")
    cursors = {p.name: json.loads(p.read_text())["cursor"] for p in state_before}
    _tamper(dest_conn, schema)
    before = _xmins(dest_conn, schema)
    httpserver.expect_request("/hook", method="POST").respond_with_data("ok")
    hook = {"REPLICATOR_WEBHOOK_URL": httpserver.url_for("/hook")}

    result, verdicts = _verify(db_project, env=hook)
    assert result.exit_code == 1, result.output
    verdict = verdicts[f"{schema}.orders"]
    assert verdict["status"] == "different"
    assert (verdict["missing"], verdict["extra"], verdict["different"]) == (2, 2, 2)
    assert verdict["not_yet_synced"] == 0
    assert sorted((e["kind"], e["key"]["id"]) for e in verdict["examples"]) == [
        ("different", 17),
        ("different", 5003),
        ("extra", -5),
        ("extra", 2000000),
        ("missing", 2),
        ("missing", 8000),
    ]
    ((request, _),) = httpserver.log
    payload = request.get_json()
    assert payload["event"] == "verify.finished"
    assert payload["status"] == "failure"
    assert payload["tables"][0]["different"] == 2
    assert _xmins(dest_conn, schema) == before, "verify alone writes nothing"

    repaired, verdicts = _verify(db_project, "--repair")
    assert repaired.exit_code == 0, repaired.output
    assert verdicts[f"{schema}.orders"]["repaired"] == 6
    assert assert_same_table(source_conn, dest_conn, schema, "orders") == 10_000
    after = _xmins(dest_conn, schema)
    rewritten = {k for k in after if after[k] != before.get(k)}
    assert rewritten == {2, 17, 5003, 8000}, "only the differing rows are written"
    cursors_after = {
        p.name: json.loads(p.read_text())["cursor"]
        for p in (db_project.path / "sync-state").glob("*.json")
    }
    assert cursors_after == cursors
    again, verdicts = _verify(db_project)
    assert again.exit_code == 0 and verdicts[f"{schema}.orders"]["status"] == "equal"


def test_rows_changed_after_the_last_sync_are_not_yet_synced(
    db_project, schema, source_conn, dest_conn
):
    _orders(source_conn, schema)
    db_project.write_config(
        {"tables": [{"name": f"{schema}.orders", "replication_key": "updated_at"}]}
    )
    assert db_project.run("sync").exit_code == 0
    source_conn.execute(
        sql.SQL(
            "UPDATE {t} SET note = 'changed', updated_at = now() WHERE id = 10; "
            "INSERT INTO {t} VALUES (10001, 'new', 1, now())"
        ).format(t=sql.Identifier(schema, "orders"))
    )
    result, verdicts = _verify(db_project)
    assert result.exit_code == 0, result.output
    verdict = verdicts[f"{schema}.orders"]
    assert verdict["status"] == "equal"
    assert verdict["not_yet_synced"] == 2
    assert db_project.run("sync").exit_code == 0
    _, verdicts = _verify(db_project)
    assert verdicts[f"{schema}.orders"]["not_yet_synced"] == 0


def test_rows_written_after_a_load_beside_an_open_transaction_are_not_yet_synced(
    db_project, schema, source_conn, dest_conn, pg_servers, loader_role
):
    """A role without monitoring privileges loads the table while another transaction is
    open: the load leaves no cursor (the next sync reads every row), so whatever the source
    writes after it is not yet synced, never missing or different (a `sync && verify`
    health check alarmed after every first load)."""
    _orders(source_conn, schema)
    db_project.env["REPLICATOR_SOURCE_URL"] = loader_role
    db_project.write_config(
        {"tables": [{"name": f"{schema}.orders", "replication_key": "updated_at"}]}
    )
    orders = sql.Identifier(schema, "orders")
    with psycopg.connect(pg_servers.source_url) as open_one:
        open_one.execute(sql.SQL("UPDATE {} SET note = 'late' WHERE id = 1").format(orders))
        assert db_project.run("sync", env=IN_PROCESS).exit_code == 0
    state = json.loads(db_project.run("state", "show", f"{schema}.orders").stdout)
    assert state[f"{schema}.orders"]["cursor"] is None, state
    assert state[f"{schema}.orders"]["pending"] is not None, state
    source_conn.execute(
        sql.SQL(
            "UPDATE {t} SET note = 'changed', updated_at = now() WHERE id = 10; "
            "INSERT INTO {t} VALUES (10001, 'new', 1, now())"
        ).format(t=orders)
    )
    result, verdicts = _verify(db_project, env=IN_PROCESS)
    assert result.exit_code == 0, result.output
    verdict = verdicts[f"{schema}.orders"]
    assert (verdict["status"], verdict["missing"], verdict["different"]) == ("equal", 0, 0)
    assert verdict["not_yet_synced"] == 3  # the open transaction's row 1, row 10 and 10001
    dest_conn.execute(sql.SQL("UPDATE {} SET note = 'by hand' WHERE id = 20").format(orders))
    assert db_project.run("sync", env=IN_PROCESS).exit_code == 0
    _, verdicts = _verify(db_project, env=IN_PROCESS)
    assert verdicts[f"{schema}.orders"]["status"] == "equal", "the sync read every row again"
    assert assert_same_table(source_conn, dest_conn, schema, "orders") == 10_001


def test_a_row_changed_by_hand_at_the_cursor_is_a_difference_while_the_sync_is_a_no_op(
    db_project, schema, source_conn, dest_conn
):
    """A copy's row edited by hand, at or past the cursor: the next sync would read it again
    only if something there changed in the source. While nothing did, that sync is a no-op
    and the row stays wrong, so verify calls it different and --repair fixes it; once the
    source changes there, the next sync reads the rows again and brings it back."""
    _orders(source_conn, schema)
    db_project.write_config(
        {"tables": [{"name": f"{schema}.orders", "replication_key": "updated_at"}]}
    )
    assert db_project.run("sync", env=IN_PROCESS).exit_code == 0
    orders = sql.Identifier(schema, "orders")
    newest = "(SELECT max(id) FROM {t})"
    dest_conn.execute(
        sql.SQL("UPDATE {t} SET note = 'by hand' WHERE id = " + newest).format(t=orders)
    )
    synced = db_project.run("sync", env=IN_PROCESS)
    assert synced.exit_code == 0 and "noop" in synced.output, synced.output
    result, verdicts = _verify(db_project, env=IN_PROCESS)
    assert result.exit_code == 1, result.output
    verdict = verdicts[f"{schema}.orders"]
    assert (verdict["different"], verdict["not_yet_synced"]) == (1, 0)
    assert verdict["examples"] == [{"key": {"id": 10_000}, "kind": "different"}]
    repaired, verdicts = _verify(db_project, "--repair", env=IN_PROCESS)
    assert repaired.exit_code == 0 and verdicts[f"{schema}.orders"]["repaired"] == 1
    assert assert_same_table(source_conn, dest_conn, schema, "orders") == 10_000

    dest_conn.execute(
        sql.SQL("UPDATE {t} SET note = 'by hand' WHERE id = " + newest).format(t=orders)
    )
    source_conn.execute(
        sql.SQL("UPDATE {t} SET note = 'changed', updated_at = now() WHERE id = 5").format(t=orders)
    )
    _, verdicts = _verify(db_project, env=IN_PROCESS)
    verdict = verdicts[f"{schema}.orders"]
    assert (verdict["different"], verdict["not_yet_synced"]) == (0, 2)
    assert db_project.run("sync", env=IN_PROCESS).exit_code == 0
    assert assert_same_table(source_conn, dest_conn, schema, "orders") == 10_000


def test_a_row_added_by_hand_to_a_deletes_copy_is_extra_and_repaired(
    db_project, schema, source_conn, dest_conn
):
    """With `deletes` set, a row only the copy holds is one of two things: the source's,
    deleted there since the last delete check (not yet synced: the next check removes it),
    or one written into the copy by hand, which the source never had: extra, whether or not
    a delete check is due, and `--repair` removes it (it used to count as not yet synced,
    and the repair left it there, exit 0)."""
    _orders(source_conn, schema, rows=100)
    entry = {"name": f"{schema}.orders", "replication_key": "updated_at", "deletes": "delete"}
    for settings in ({"deletes_interval": 3600}, {}):
        db_project.write_config({"tables": [{**entry, **settings}]})
        assert db_project.run("sync", env=IN_PROCESS).exit_code == 0  # the load, or a check
    orders = sql.Identifier(schema, "orders")
    dest_conn.execute(
        sql.SQL("INSERT INTO {} VALUES (-1, 'by hand', 1, now() - interval '40 days')").format(
            orders
        )
    )
    source_conn.execute(sql.SQL("DELETE FROM {} WHERE id = 7").format(orders))
    for settings in ({"deletes_interval": 3600}, {}):
        db_project.write_config({"tables": [{**entry, **settings}]})
        result, verdicts = _verify(db_project, env=IN_PROCESS)
        assert result.exit_code == 1, result.output
        verdict = verdicts[f"{schema}.orders"]
        due = not settings
        assert (verdict["extra"], verdict["not_yet_synced"]) == (1 + (not due), int(due))
        assert {"key": {"id": -1}, "kind": "extra"} in verdict["examples"]
    repaired, verdicts = _verify(db_project, "--repair", env=IN_PROCESS)
    assert repaired.exit_code == 0, repaired.output
    assert verdicts[f"{schema}.orders"]["repaired"] == 1
    assert dest_conn.execute(
        sql.SQL("SELECT count(*) FROM {} WHERE id = -1").format(orders)
    ).fetchone() == (0,)
    assert db_project.run("sync", env=IN_PROCESS).exit_code == 0  # its check removes row 7
    assert assert_same_table(source_conn, dest_conn, schema, "orders") == 99


def test_a_key_written_behind_the_cursor_is_found_and_repaired(
    db_project, schema, source_conn, dest_conn
):
    """A `timestamp` key written in local time after the source's TimeZone changed lands
    behind the cursor: the sync skips the row, verify names it, --repair fixes it."""
    source_conn.execute(
        sql.SQL(
            "CREATE TABLE {t} (id int PRIMARY KEY, note text, at timestamp NOT NULL); "
            "INSERT INTO {t} SELECT g, 'n', timestamp '2026-11-01 00:00' + g * interval '1 minute' "
            "FROM generate_series(1, 500) g"
        ).format(t=sql.Identifier(schema, "events"))
    )
    db_project.write_config({"tables": [{"name": f"{schema}.events", "replication_key": "at"}]})
    assert db_project.run("sync").exit_code == 0
    source_conn.execute(
        sql.SQL(
            "UPDATE {t} SET note = 'an hour behind', at = at - interval '1 hour' WHERE id = 400"
        ).format(t=sql.Identifier(schema, "events"))
    )
    assert db_project.run("sync").exit_code == 0
    result, verdicts = _verify(db_project)
    assert result.exit_code == 1
    assert verdicts[f"{schema}.events"]["examples"] == [{"key": {"id": 400}, "kind": "different"}]
    assert _verify(db_project, "--repair")[0].exit_code == 0
    assert assert_same_table(source_conn, dest_conn, schema, "events") == 500


def test_composite_text_keys_compare_across_collations(db_project, schema, source_conn, dest_conn):
    """The destination orders the text key otherwise (ICU, upper case after lower): key
    ranges still select the same rows on both sides."""
    source_conn.execute(
        sql.SQL(
            "CREATE TABLE {t} (shop int, code text, qty int, PRIMARY KEY (shop, code)); "
            "INSERT INTO {t} SELECT g % 3, (ARRAY['a', 'B', 'c', 'D', 'é', 'Z'])[g % 6 + 1] "
            "|| g, g FROM generate_series(1, 9000) g"
        ).format(t=sql.Identifier(schema, "stock"))
    )
    db_project.write_config({"tables": [{"name": f"{schema}.stock", "mode": "full-refresh"}]})
    assert db_project.run("sync").exit_code == 0
    stock = sql.Identifier(schema, "stock")
    dest_conn.execute(
        sql.SQL('ALTER TABLE {} ALTER COLUMN code TYPE text COLLATE "und-x-icu"').format(stock)
    )
    result, verdicts = _verify(db_project)
    assert result.exit_code == 0, result.output
    assert verdicts[f"{schema}.stock"]["rows_compared"] == 9000
    dest_conn.execute(
        sql.SQL("UPDATE {} SET qty = -1 WHERE shop = 1 AND code = 'B1'").format(stock)
    )
    dest_conn.execute(sql.SQL("DELETE FROM {} WHERE shop = 2 AND code = 'Z5'").format(stock))
    result, verdicts = _verify(db_project)
    assert result.exit_code == 1, verdicts
    assert sorted(
        (e["kind"], e["key"]["shop"], e["key"]["code"])
        for e in verdicts[f"{schema}.stock"]["examples"]
    ) == [
        ("different", 1, "B1"),
        ("missing", 2, "Z5"),
    ]
    assert _verify(db_project, "--repair")[0].exit_code == 0
    assert _verify(db_project)[0].exit_code == 0


def test_hostile_names_and_a_model_with_a_filter(db_project, schema, source_conn, dest_conn):
    """Quotes, spaces, capitals and `%` everywhere; rows that leave the model's filter are
    extra in the destination (the model says they are not there)."""
    table = 'Order "Lines".😀 %s'
    key, when = '"Id" 😀', "Updated At"
    source_conn.execute(
        sql.SQL(
            "CREATE TABLE {t} ({k} bigint PRIMARY KEY, {s} text, {w} timestamptz NOT NULL); "
            "INSERT INTO {t} SELECT g, CASE WHEN g % 10 = 0 THEN 'void' ELSE '100%' END, "
            "now() - interval '1 day' + g * interval '1 second' FROM generate_series(1, 3000) g"
        ).format(
            t=sql.Identifier(schema, table),
            k=sql.Identifier(key),
            s=sql.Identifier("select"),
            w=sql.Identifier(when),
        )
    )
    full = f"{quote_ident(schema)}.{quote_ident(table)}"
    model = Templates(db_project.path).model_path(TableName(schema, table))
    model.parent.mkdir(parents=True)
    model.write_text(f"SELECT * FROM {full} WHERE \"select\" <> 'void' AND \"select\" LIKE '%'")
    db_project.write_config({"tables": [{"name": full, "replication_key": quote_ident(when)}]})
    synced = db_project.run("sync")
    assert synced.exit_code == 0, synced.output
    source_conn.execute(
        sql.SQL("UPDATE {t} SET {s} = 'void' WHERE {k} = 7").format(
            t=sql.Identifier(schema, table), s=sql.Identifier("select"), k=sql.Identifier(key)
        )
    )
    result, verdicts = _verify(db_project)
    assert result.exit_code == 1, result.output
    (verdict,) = verdicts.values()
    assert verdict["examples"] == [{"key": {key: 7}, "kind": "extra"}], verdict["error"]
    assert _verify(db_project, "--repair")[0].exit_code == 0
    (count,) = dest_conn.execute(
        sql.SQL("SELECT count(*) FROM {}").format(sql.Identifier(schema, table))
    ).fetchone()
    assert count == 3000 - 300 - 1


def test_tables_that_cannot_be_compared_fail_with_the_fix(db_project, schema, source_conn):
    source_conn.execute(
        sql.SQL(
            "CREATE TABLE {s}.nokey (a int, b text); INSERT INTO {s}.nokey VALUES (1, 'x');"
            "CREATE TABLE {s}.later (id int PRIMARY KEY)"
        ).format(s=sql.Identifier(schema))
    )
    db_project.write_config(
        {
            "tables": [
                {"name": f"{schema}.nokey", "mode": "full-refresh"},
                {"name": f"{schema}.later", "mode": "full-refresh"},
            ]
        }
    )
    assert db_project.run("sync", "-s", f"{schema}.nokey").exit_code == 0
    result, verdicts = _verify(db_project)
    assert result.exit_code == 1
    # A table without a key is compared as a multiset (test_keyless.py), never failed for it.
    assert verdicts[f"{schema}.nokey"]["status"] == "equal"
    assert "replicator sync -s" in verdicts[f"{schema}.later"]["error"]
    unknown = db_project.run("verify", "-s", f"{schema}.nowhere")
    assert unknown.exit_code == 2


def test_a_repair_says_it_repaired_the_differences_beyond_the_examples(
    db_project, schema, source_conn, dest_conn
):
    """`verify --repair` printed `... and 2 more (all of them with --repair)` after it had
    repaired them (a newcomer trial)."""
    _orders(source_conn, schema, rows=100)
    db_project.write_config(
        {"tables": [{"name": f"{schema}.orders", "replication_key": "updated_at"}]}
    )
    assert db_project.run("sync", env=IN_PROCESS).exit_code == 0
    dest_conn.execute(
        sql.SQL("DELETE FROM {} WHERE id <= 12").format(sql.Identifier(schema, "orders"))
    )
    said = db_project.run("verify", env=IN_PROCESS)
    assert said.exit_code == 1
    assert f"{schema}.orders: ... and 2 more (all of them with --repair)" in said.stdout
    repaired = db_project.run("verify", "--repair", env=IN_PROCESS)
    assert repaired.exit_code == 0, repaired.output
    assert f"{schema}.orders: ... and 2 more; all 12 differences repaired" in repaired.stdout
    assert "with --repair" not in repaired.stdout


def test_a_table_verify_could_not_compare_shows_no_counts(db_project, schema, source_conn):
    """With the destination down, a failed table's row read `0` rows, `0` missing, `0` extra:
    an equal, empty table (a newcomer trial)."""
    _orders(source_conn, schema, rows=10)
    db_project.write_config(
        {"tables": [{"name": f"{schema}.orders", "replication_key": "updated_at"}]}
    )
    down = f"postgresql://postgres@127.0.0.1:{free_port()}/postgres?connect_timeout=2"
    for args in ((), ("--repair",)):
        result = db_project.run("verify", *args, env={"REPLICATOR_DEST_URL": down})
        assert result.exit_code == 1
        row = next(line for line in result.stdout.splitlines() if f"{schema}.orders" in line)
        cells = [cell.strip() for cell in row.strip("│ ").split("│")]
        assert cells == [f"{schema}.orders", "failed", *["-"] * (5 + len(args))], row
        assert "destination" in result.stdout


def test_a_repair_killed_before_it_commits_converges(db_project, schema, source_conn, dest_conn):
    _orders(source_conn, schema)
    db_project.write_config(
        {"tables": [{"name": f"{schema}.orders", "replication_key": "updated_at"}]}
    )
    assert db_project.run("sync").exit_code == 0
    _tamper(dest_conn, schema)
    killed = db_project.run_process(
        "verify", "--repair", env={**IN_PROCESS, "REPLICATOR_FAILPOINT": "repair-before-commit"}
    )
    assert killed.returncode == -9
    result, verdicts = _verify(db_project, "--repair")
    assert result.exit_code == 0, result.output
    assert verdicts[f"{schema}.orders"]["repaired"] == 6
    assert assert_same_table(source_conn, dest_conn, schema, "orders") == 10_000


def test_a_million_rows_through_spark(db_project, schema, source_conn, dest_conn):
    _orders(source_conn, schema, rows=1_000_000)
    db_project.write_config(
        {"tables": [{"name": f"{schema}.orders", "replication_key": "updated_at"}]}
    )
    assert db_project.run("sync").exit_code == 0
    dest_conn.execute(sql.SQL("ANALYZE {}").format(sql.Identifier(schema, "orders")))
    _tamper(dest_conn, schema)
    result, verdicts = _verify(db_project)
    assert result.exit_code == 1, result.output
    verdict = verdicts[f"{schema}.orders"]
    assert verdict["rows_compared"] == 1_000_000
    assert (verdict["missing"], verdict["extra"], verdict["different"]) == (2, 2, 2)
    assert _verify(db_project, "--repair")[0].exit_code == 0
    assert _verify(db_project)[0].exit_code == 0


def test_differences_in_more_buckets_than_one_row_query_reads_are_each_found(
    db_project, schema, source_conn, dest_conn
):
    """Damage in 300 buckets of a few hundred rows: their rows are read in several row
    queries (each holds a bounded number of rows), and every difference is found once."""
    _orders(source_conn, schema, rows=120_000)
    db_project.write_config(
        {"tables": [{"name": f"{schema}.orders", "replication_key": "updated_at"}]}
    )
    assert db_project.run("sync", env=IN_PROCESS).exit_code == 0
    orders = sql.Identifier(schema, "orders")
    dest_conn.execute(sql.SQL("ANALYZE {}").format(orders))
    dest_conn.execute(sql.SQL("UPDATE {} SET note = 'x' WHERE id % 800 = 1").format(orders))
    dest_conn.execute(sql.SQL("DELETE FROM {} WHERE id % 800 = 401").format(orders))
    dest_conn.execute(
        sql.SQL(
            "INSERT INTO {} SELECT -g, 'extra', 1, now() - interval '40 days' "
            "FROM generate_series(1, 150) g"
        ).format(orders)
    )
    result, verdicts = _verify(db_project, env=IN_PROCESS)
    assert result.exit_code == 1, result.output
    verdict = verdicts[f"{schema}.orders"]
    assert (verdict["missing"], verdict["extra"], verdict["different"]) == (150, 150, 150)
    assert verdict["rows_compared"] == 120_000
    assert _verify(db_project, "--repair", env=IN_PROCESS)[0].exit_code == 0
    assert assert_same_table(source_conn, dest_conn, schema, "orders") == 120_000


def test_a_repair_that_would_empty_the_copy_needs_force(db_project, schema, source_conn, dest_conn):
    _orders(source_conn, schema, rows=1000)
    db_project.write_config({"tables": [{"name": f"{schema}.orders", "mode": "full-refresh"}]})
    assert db_project.run("sync").exit_code == 0
    source_conn.execute(sql.SQL("TRUNCATE {}").format(sql.Identifier(schema, "orders")))
    refused, verdicts = _verify(db_project, "--repair")
    assert refused.exit_code == 1
    verdict = verdicts[f"{schema}.orders"]
    assert (verdict["extra"], verdict["repaired"]) == (1000, 0)
    assert "repair refused: it would delete 1,000 of 1,000 rows" in verdict["error"]
    assert "--repair --force" in verdict["error"]
    assert len(_xmins(dest_conn, schema)) == 1000
    assert db_project.run("verify", "--force").exit_code == 2
    forced, verdicts = _verify(db_project, "--repair", "--force")
    assert forced.exit_code == 0 and verdicts[f"{schema}.orders"]["repaired"] == 1000
    assert _xmins(dest_conn, schema) == {}


def test_changes_not_yet_applied_are_not_yet_synced_in_every_mode(
    cdc_project, schema, source_conn, dest_conn, writer
):
    """A cron health check on `verify` against a busy source: a row deleted since the last
    sync of a `deletes: delete` table and a change still in a `cdc` table's slot are not yet
    synced (they were `extra` and `different`, exit 1), while a row tampered with in the
    copy is still a difference."""
    for table in ("gone", "logged"):
        _orders(writer, schema, rows=1_000, table=table)
    cdc_project.write_config(
        {
            "tables": [
                {"name": f"{schema}.gone", "replication_key": "updated_at", "deletes": "delete"},
                {"name": f"{schema}.logged", "mode": "cdc"},
            ]
        }
    )
    assert cdc_project.run("sync").exit_code == 0
    writer.execute(sql.SQL("DELETE FROM {} WHERE id = 3").format(sql.Identifier(schema, "gone")))
    writer.execute(
        sql.SQL(
            "UPDATE {t} SET note = 'pending' WHERE id = 10; DELETE FROM {t} WHERE id = 11; "
            "INSERT INTO {t} VALUES (5000, 'new', 1, now()); "
            "UPDATE {t} SET id = 6000 WHERE id = 12"
        ).format(t=sql.Identifier(schema, "logged"))
    )
    result, verdicts = _verify(cdc_project)
    assert result.exit_code == 0, result.output
    counts = {
        name.split(".")[1]: (
            v["status"],
            v["missing"],
            v["extra"],
            v["different"],
            v["not_yet_synced"],
        )
        for name, v in verdicts.items()
    }
    assert counts == {
        "gone": ("equal", 0, 0, 0, 1),
        "logged": ("equal", 0, 0, 0, 5),  # 10, 11, 5000, and 12 moved to 6000
    }
    dest_conn.execute(
        sql.SQL("UPDATE {} SET note = 'tampered' WHERE id = 30").format(
            sql.Identifier(schema, "logged")
        )
    )
    result, verdicts = _verify(cdc_project, "-s", f"{schema}.logged")
    assert result.exit_code == 1
    logged = verdicts[f"{schema}.logged"]
    assert (logged["different"], logged["not_yet_synced"]) == (1, 5)
    assert logged["examples"] == [{"key": {"id": 30}, "kind": "different"}]
    assert cdc_project.run("sync").exit_code == 0
    writer.execute(sql.SQL("TRUNCATE {}").format(sql.Identifier(schema, "gone")))
    refused = cdc_project.run("sync", "-s", f"{schema}.gone")
    assert refused.exit_code == 1 and "more than half" in refused.stderr, refused.stderr
    result, verdicts = _verify(cdc_project, "-s", f"{schema}.gone")
    assert result.exit_code == 1, "the sync refuses to delete them: not pending, different"
    assert (verdicts[f"{schema}.gone"]["extra"], verdicts[f"{schema}.gone"]["not_yet_synced"]) == (
        999,
        0,
    )
    assert cdc_project.run("sync", "--deletes", "--force", "-s", f"{schema}.gone").exit_code == 0
    repaired, verdicts = _verify(cdc_project, "--repair")
    assert repaired.exit_code == 0, repaired.output
    for table in ("gone", "logged"):
        assert verdicts[f"{schema}.{table}"]["not_yet_synced"] == 0
        assert_same_table(source_conn, dest_conn, schema, table)


def test_a_configured_key_on_two_source_rows_is_said_and_left_to_the_sync(
    db_project, schema, source_conn, dest_conn
):
    """A keyless source whose configured primary_key repeats: the copy holds the newest row
    of the key, which verify counts as equal and names; a copy matching none of them is
    different, and a repair leaves it to `sync -f` rather than write either one."""
    table = sql.Identifier(schema, "log")
    source_conn.execute(
        sql.SQL("CREATE TABLE {} (id int, note text, updated_at timestamptz NOT NULL)").format(
            table
        )
    )
    source_conn.execute(
        sql.SQL(
            "INSERT INTO {} SELECT g, 'n' || g, now() FROM generate_series(1, 300) g "
            "UNION ALL VALUES (2, 'older', now() - interval '1 minute'), "
            "(3, 'newer', now() + interval '1 minute')"
        ).format(table)
    )
    entry = {"name": f"{schema}.log", "replication_key": "updated_at", "primary_key": ["id"]}
    db_project.write_config({"tables": [entry]})
    assert db_project.run("sync", env=IN_PROCESS).exit_code == 0
    kept = "SELECT id, note FROM {} WHERE id IN (2, 3) ORDER BY id"
    assert dest_conn.execute(sql.SQL(kept).format(table)).fetchall() == [(2, "n2"), (3, "newer")]

    for _ in range(2):  # the same verdict however the rows of a key come back
        checked = db_project.run("verify", "--json", env=IN_PROCESS)
        assert checked.exit_code == 0, checked.output
        (verdict,) = json.loads(checked.stdout)
        assert verdict["status"] == "equal" and verdict["repeated_keys"] == 2, verdict
        assert verdict["examples"] == [
            {"key": {"id": 2}, "kind": "repeated_key"},
            {"key": {"id": 3}, "kind": "repeated_key"},
        ] or verdict["examples"] == [
            {"key": {"id": 3}, "kind": "repeated_key"},
            {"key": {"id": 2}, "kind": "repeated_key"},
        ], verdict
    assert "2 key(s) on more than one source row" in checked.stderr, checked.stderr
    said = db_project.run("verify", env=IN_PROCESS)
    assert 'repeated key {"id": 2}' in said.output and "--repair leaves them" in said.output

    dest_conn.execute(sql.SQL("UPDATE {} SET note = 'by hand' WHERE id = 3").format(table))
    repaired = db_project.run("verify", "--repair", "--json", env=IN_PROCESS)
    assert repaired.exit_code == 1, repaired.output
    (verdict,) = json.loads(repaired.stdout)
    assert (verdict["status"], verdict["different"], verdict["repaired"]) == ("different", 1, 0)
    assert dest_conn.execute(sql.SQL(kept).format(table)).fetchall() == [(2, "n2"), (3, "by hand")]
    assert db_project.run("sync", "-f", env=IN_PROCESS).exit_code == 0
    assert dest_conn.execute(sql.SQL(kept).format(table)).fetchall() == [(2, "n2"), (3, "newer")]
    assert db_project.run("verify", env=IN_PROCESS).exit_code == 0


_CLI = [sys.executable, "-m", "replicator"]


def test_verify_beside_a_following_sync_and_a_writer_raises_no_false_alarm(
    cdc_project, schema, source_conn, dest_conn, writer, pg_servers
):
    """`sync --follow` applies a `cdc` table's changes while verify reads it, and a writer
    keeps changing it (the test servers commit without waiting for the WAL flush): a change
    applied between verify's snapshots and its look at the slot is no longer in the slot,
    and one committed but not yet flushed is not there yet. Neither is a difference (they
    were: thousands of rows, exit 1, on every run, a newcomer trial); a tampered row the
    writer leaves alone is."""
    _orders(writer, schema, rows=2_000, table="busy")
    busy = sql.Identifier(schema, "busy")
    cdc_project.write_config({"tables": [{"name": f"{schema}.busy", "mode": "cdc"}]})
    assert cdc_project.run("sync").exit_code == 0
    stop = threading.Event()

    def write() -> None:
        with psycopg.connect(pg_servers.source_url, autocommit=True) as conn:
            n = 0
            while not stop.is_set():
                n += 1
                conn.execute(
                    sql.SQL(
                        "UPDATE {} SET amount = amount + 1 WHERE id > 1000 AND id %% 97 = %s"
                    ).format(busy),
                    (n % 97,),
                )
                conn.execute(
                    sql.SQL("INSERT INTO {} VALUES (%s, 'new', 1, now())").format(busy),
                    (10_000 + n,),
                )

    writing = threading.Thread(target=write)
    writing.start()
    follow = subprocess.Popen(
        [
            *_CLI,
            "sync",
            "--follow",
            "--interval",
            "0.3",
            "-q",
            "--project-dir",
            str(cdc_project.path),
        ],
        env={**os.environ, **cdc_project.env},
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        for _ in range(3):
            result, verdicts = _verify(cdc_project, "-s", f"{schema}.busy")
            verdict = verdicts[f"{schema}.busy"]
            assert result.exit_code == 0, verdict
            assert (verdict["missing"], verdict["extra"], verdict["different"]) == (0, 0, 0)
        dest_conn.execute(sql.SQL("UPDATE {} SET note = 'tampered' WHERE id = 5").format(busy))
        result, verdicts = _verify(cdc_project, "-s", f"{schema}.busy")
        assert result.exit_code == 1, result.output
        assert verdicts[f"{schema}.busy"]["examples"] == [{"key": {"id": 5}, "kind": "different"}]
    finally:
        stop.set()
        writing.join()
        follow.send_signal(signal.SIGTERM)
        _, errors = follow.communicate(timeout=60)
    assert follow.returncode == 0, errors


def test_rows_a_sync_applies_while_verify_waits_for_the_slot_are_not_differences(
    cdc_project, schema, source_conn, dest_conn, writer, tmp_path
):
    """verify finds differences, and the slot is busy: a sync is applying them (held here
    on a row of the copy the test locks). verify waits for the slot; the sync finishes and
    moves the slot past the changes, so the slot no longer tells them from differences:
    the rows are read again as they are now, equal, and not yet synced (they were
    differences, exit 1, a newcomer trial). One row is written again on the source after
    verify's look at the slot and before it reads the rows again (verify waits there for
    the test, REPLICATOR_PAUSE_AT): it differs then, and its change is in the slot, so it
    is not yet synced either (it was a difference, exit 1: CI, beside `sync --follow` and
    a writer)."""
    _orders(writer, schema, rows=2_000, table="moved")
    moved = sql.Identifier(schema, "moved")
    cdc_project.write_config({"tables": [{"name": f"{schema}.moved", "mode": "cdc"}]})
    assert cdc_project.run("sync").exit_code == 0
    writer.execute(sql.SQL("UPDATE {} SET amount = amount + 1 WHERE id <= 500").format(moved))
    env = {**os.environ, **cdc_project.env}
    project = ["--project-dir", str(cdc_project.path)]
    with psycopg.connect(dest_conn.info.dsn) as holder:
        holder.execute(sql.SQL("SELECT FROM {} WHERE id = 250 FOR UPDATE").format(moved))
        syncing = subprocess.Popen(
            [*_CLI, "sync", "-q", *project],
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        wait_for(
            lambda: dest_conn.execute(
                "SELECT EXISTS (SELECT FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                "AND query LIKE %s)",
                (f"UPDATE %{schema}%",),
            ).fetchone()[0],
            120,
            "the sync's apply waiting on the held row",
        )
        log = tmp_path / "verify.log"
        pause = tmp_path / "pause"
        reached = tmp_path / "pause.reached"
        with log.open("w") as err:
            verifying = subprocess.Popen(
                [*_CLI, "verify", "--json", "-v", "-s", f"{schema}.moved", *project],
                env={**env, "REPLICATOR_PAUSE_AT": f"verify-before-reading-again={pause}"},
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=err,
                text=True,
            )
            wait_for(
                lambda: "pg_logical_slot_peek_binary_changes" in log.read_text(),
                120,
                "verify looking at the slot the sync holds",
            )
            holder.rollback()  # the sync applies, confirms and lets the slot go
            assert syncing.wait(timeout=120) == 0
            wait_for(lambda: reached.exists(), 120, "verify about to read the rows again")
            writer.execute(
                sql.SQL("UPDATE {} SET amount = amount + 1 WHERE id = 250").format(moved)
            )
            pause.touch()
            out, _ = verifying.communicate(timeout=120)
    (verdict,) = json.loads(out)
    assert verifying.returncode == 0, verdict
    assert (verdict["missing"], verdict["extra"], verdict["different"]) == (0, 0, 0), verdict
    assert verdict["not_yet_synced"] == 500, verdict


def test_a_repair_beside_a_sync_of_the_table_says_to_run_it_again(
    db_project, schema, source_conn, dest_conn
):
    """The table's destination lock is held (as a sync of it holds it): the repair fails
    the table and says so, naming what may hold it, not "the next run retries"."""
    from replicator.postgres.table_lock import lock_key

    _orders(source_conn, schema, rows=100)
    db_project.write_config({"tables": [{"name": f"{schema}.orders", "mode": "full-refresh"}]})
    assert db_project.run("sync", env=IN_PROCESS).exit_code == 0
    with psycopg.connect(dest_conn.info.dsn) as holder:
        holder.execute(
            "SELECT pg_advisory_xact_lock(%s::bigint)", (lock_key(TableName(schema, "orders")),)
        )
        result = db_project.run("verify", "--repair", env=IN_PROCESS)
    assert result.exit_code == 1, result.output
    assert (
        "another replicator run (a sync, `sync --follow` or `verify --repair` of this project"
        in result.output
    ), result.output
    assert "not repaired: run `verify --repair` again once it is done" in result.output
    assert "the next run retries" not in result.output
