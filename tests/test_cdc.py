"""`mode: "cdc"`: every insert, update, delete and truncate from a logical replication slot,
applied exactly once, against real servers."""

from __future__ import annotations

import json
import os
import resource
import signal
import threading
import time
import uuid

import pytest
from dbcompare import assert_same_table
from following import Follow
from psycopg import sql

pytestmark = pytest.mark.spark


def _create(conn, schema, table="orders", rows=100):
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


def _config(project, schema, *tables, **top):
    project.write_config(
        {"tables": [{"name": f"{schema}.{t}", "mode": "cdc"} for t in tables], **top}
    )


def _run(conn, schema, statement, *params, table="orders"):
    conn.execute(sql.SQL(statement).format(t=sql.Identifier(schema, table)), params or None)


def _sync(project, *args):
    result = project.run("sync", *args)
    assert result.exit_code == 0, result.output
    return result


def test_inserts_updates_deletes_and_truncate_arrive_exactly_once(
    cdc_project, schema, writer, source_conn, dest_conn
):
    _create(writer, schema)
    _config(cdc_project, schema, "orders")
    first = _sync(cdc_project)
    assert "full_reload" in first.stderr and "reason: no state" in first.stderr
    assert_same_table(source_conn, dest_conn, schema, "orders")

    _run(writer, schema, "INSERT INTO {t} VALUES (1000, 'new', 1, NULL)")
    _run(writer, schema, "UPDATE {t} SET note = 'changed' WHERE id <= 10")
    _run(writer, schema, "DELETE FROM {t} WHERE id BETWEEN 20 AND 29")
    with writer.transaction():  # a key updated several times in one batch
        for value in ("a", "b", "c"):
            _run(writer, schema, "UPDATE {t} SET note = %s WHERE id = 50", value)
    _run(writer, schema, "DELETE FROM {t} WHERE id = 60")  # deleted, then back
    _run(writer, schema, "INSERT INTO {t} VALUES (60, 'back', 6, NULL)")
    _run(writer, schema, "UPDATE {t} SET id = 5000 WHERE id = 70")  # the key moves
    second = _sync(cdc_project)
    assert "orders: incremental" in second.stderr, second.stderr
    assert assert_same_table(source_conn, dest_conn, schema, "orders") == 91

    third = _sync(cdc_project)
    assert "orders: noop" in third.stderr

    _run(writer, schema, "TRUNCATE {t}")
    _run(writer, schema, "INSERT INTO {t} VALUES (1, 'after the truncate', 1, NULL)")
    fourth = _sync(cdc_project)
    assert "; truncated" in fourth.stderr, fourth.stderr  # the log says the copy was emptied
    assert assert_same_table(source_conn, dest_conn, schema, "orders") == 1


def test_an_update_to_the_same_values_rewrites_nothing_but_a_new_spelling_arrives(
    cdc_project, schema, writer, source_conn, dest_conn
):
    """The log carries an update that wrote the same values: the copy's row is left as it is
    (no new row version). numeric's 3.00 equals 3.0 by `=` but prints otherwise: written."""
    _create(writer, schema, rows=6)
    _config(cdc_project, schema, "orders")
    _sync(cdc_project)
    versions = sql.SQL("SELECT id, xmin::text FROM {} ORDER BY id").format(
        sql.Identifier(schema, "orders")
    )
    before = dict(dest_conn.execute(versions).fetchall())
    _run(writer, schema, "UPDATE {t} SET note = note, amount = amount WHERE id <= 5")
    _run(writer, schema, "UPDATE {t} SET amount = 3.00 WHERE id = 2")  # it was 3.0
    _sync(cdc_project)
    after = dict(dest_conn.execute(versions).fetchall())
    assert [i for i in before if after[i] != before[i]] == [2]
    assert assert_same_table(source_conn, dest_conn, schema, "orders") == 6
    amount = sql.SQL("SELECT amount::text FROM {} WHERE id = 2").format(
        sql.Identifier(schema, "orders")
    )
    assert dest_conn.execute(amount).fetchone() == ("3.00",)


@pytest.mark.parametrize("rows", [8, 1500])
def test_an_update_of_a_row_the_copy_lacks_puts_it_back(
    cdc_project, schema, writer, source_conn, dest_conn, rows
):
    """Updates are written by key, and one whose row the copy has lost (deleted there by
    hand) finds nothing to update: the row is inserted, in a batch of plain updates (staged
    one by one, and a thousand or more at once, where the reader counts the updates the
    apply expects) and in one whose changes are reduced to each key's last."""
    _create(writer, schema, rows=rows)
    _config(cdc_project, schema, "orders")
    _sync(cdc_project)
    target = sql.Identifier(schema, "orders")
    dest_conn.execute(sql.SQL("DELETE FROM {} WHERE id IN (3, 7)").format(target))
    _run(writer, schema, "UPDATE {t} SET note = 'changed' WHERE id <= %s", rows - 3)
    _sync(cdc_project)
    with writer.transaction():  # a key twice: the batch is reduced first
        _run(writer, schema, "UPDATE {t} SET note = 'x' WHERE id = 7")
        _run(writer, schema, "UPDATE {t} SET note = 'y' WHERE id = 7")
    _sync(cdc_project)
    assert assert_same_table(source_conn, dest_conn, schema, "orders") == rows


def test_unchanged_toasted_values_keep_the_destinations(
    cdc_project, schema, writer, source_conn, dest_conn
):
    _create(writer, schema, rows=5)
    big = "".join(uuid.uuid4().hex for _ in range(600))  # incompressible: stored out of line
    _run(writer, schema, "UPDATE {t} SET big = %s || id", big)
    _config(cdc_project, schema, "orders")
    _sync(cdc_project)
    _run(writer, schema, "UPDATE {t} SET note = 'touched' WHERE id IN (1, 2)")
    with writer.transaction():  # inserted and updated in one batch: the value is the insert's
        _run(writer, schema, "INSERT INTO {t} VALUES (9, 'x', 1, %s)", big + "nine")
        _run(writer, schema, "UPDATE {t} SET note = 'y' WHERE id = 9")
    _run(writer, schema, "UPDATE {t} SET id = 30 WHERE id = 3")  # moved, value unchanged
    _sync(cdc_project)
    assert assert_same_table(source_conn, dest_conn, schema, "orders") == 6


def test_a_column_named_like_the_applys_own_aliases_takes_unchanged_toasted_values(
    cdc_project, schema, writer, source_conn, dest_conn
):
    """The apply's statements for unchanged TOASTed values unnest column positions under an
    alias; a table's own column of that name (`p`) made them ambiguous, and the table
    failed, then reloaded, at every such batch (a newcomer trial)."""
    target = sql.Identifier(schema, "pt")
    writer.execute(
        sql.SQL("CREATE TABLE {} (id int PRIMARY KEY, p int, n text, s text)").format(target)
    )
    big = "".join(uuid.uuid4().hex for _ in range(600))  # incompressible: stored out of line
    writer.execute(
        sql.SQL("INSERT INTO {} SELECT g, g, %s || g, 's' FROM generate_series(1, 5) g").format(
            target
        ),
        (big,),
    )
    cdc_project.write_config({"tables": [{"name": f"{schema}.pt", "mode": "cdc"}]})
    _sync(cdc_project)
    writer.execute(sql.SQL("UPDATE {} SET p = -p WHERE id IN (1, 2)").format(target))
    writer.execute(sql.SQL("UPDATE {} SET id = 30 WHERE id = 3").format(target))  # moved
    synced = _sync(cdc_project)
    assert f"{schema}.pt: incremental" in synced.stderr, synced.stderr
    assert assert_same_table(source_conn, dest_conn, schema, "pt") == 5


def test_a_big_batch_with_values_copy_must_escape_arrives_whole(
    cdc_project, schema, writer, source_conn, dest_conn
):
    """A batch of a thousand changes or more is staged many rows at once (cdc/
    copy_block.py), the changes it cannot take one by one: tabs, newlines and backslashes,
    empty strings and NULLs, unchanged TOASTed values and moved keys among plain changes
    all arrive as the source has them."""
    _create(writer, schema, rows=1500)
    big = "".join(uuid.uuid4().hex for _ in range(600))  # stored out of line
    _run(writer, schema, "UPDATE {t} SET big = %s || id WHERE id <= 20", big)
    _config(cdc_project, schema, "orders")
    _sync(cdc_project)
    with writer.transaction():
        _run(
            writer,
            schema,
            "UPDATE {t} SET amount = amount + 1, note = CASE id % 6 WHEN 0 THEN E'a\\tb' "
            "WHEN 1 THEN '' WHEN 2 THEN NULL WHEN 3 THEN E'c\\\\d\\ne\\r' "
            "WHEN 4 THEN E'\\\\N' ELSE note || '!' END WHERE id <= 1200",
        )
        _run(writer, schema, "DELETE FROM {t} WHERE id > 1400")
        _run(
            writer,
            schema,
            "INSERT INTO {t} SELECT g, 'new', g, NULL FROM generate_series(2000, 2300) g",
        )
        _run(writer, schema, "UPDATE {t} SET id = id + 10000 WHERE id BETWEEN 1 AND 5")
    second = _sync(cdc_project)
    assert "orders: incremental" in second.stderr, second.stderr
    assert assert_same_table(source_conn, dest_conn, schema, "orders") == 1400 + 301
    values = sql.SQL("SELECT count(*) FILTER (WHERE note = '') FROM {}").format(
        sql.Identifier(schema, "orders")
    )
    assert dest_conn.execute(values).fetchone() == (200,)  # empty strings, not NULLs


def test_small_batches_applied_while_the_next_is_read_keep_commit_order(
    cdc_project, schema, writer, source_conn, dest_conn, monkeypatch
):
    """Many batches and reads: each batch is staged on one session while the one before is
    applied on the other; a row's later change (a TOASTed value kept across a move, a delete
    then a re-insert) lands after its earlier one, in another batch."""
    monkeypatch.setattr("replicator.cdc.drain.BATCH_CHANGES", 4)
    _create(writer, schema, "orders", rows=20)
    _create(writer, schema, "items", rows=20)
    big = "".join(uuid.uuid4().hex for _ in range(600))  # stored out of line
    _run(writer, schema, "UPDATE {t} SET big = %s || id WHERE id <= 3", big)
    _config(cdc_project, schema, "orders", "items")
    _sync(cdc_project)
    for n in range(1, 11):
        with writer.transaction():  # one transaction across both tables
            _run(writer, schema, "UPDATE {t} SET amount = %s WHERE id = %s", n, n)
            _run(
                writer, schema, "UPDATE {t} SET note = %s WHERE id = %s", f"i{n}", n, table="items"
            )
    for n in range(1, 4):  # a TOASTed row moved to a new key, then touched, one per batch
        _run(writer, schema, "UPDATE {t} SET id = id + 100 WHERE id = %s", n)
        _run(writer, schema, "UPDATE {t} SET note = 'moved' WHERE id = %s", n + 100)
    _run(writer, schema, "DELETE FROM {t} WHERE id = 15", table="items")
    _run(writer, schema, "INSERT INTO {t} VALUES (15, 'back', 1, NULL)", table="items")
    synced = _sync(cdc_project, "-v")
    batches = int(synced.stderr.split(" batch(es)")[0].rsplit(" in ", 1)[1])
    assert batches >= 8, synced.stderr
    assert assert_same_table(source_conn, dest_conn, schema, "orders") == 20
    assert assert_same_table(source_conn, dest_conn, schema, "items") == 20


def test_a_transaction_bigger_than_a_batch_is_applied_in_parts_and_committed_once(
    cdc_project, schema, writer, source_conn, dest_conn, monkeypatch
):
    """One source transaction of many batches' worth of changes: its parts are applied while
    the rest is read, in one destination transaction. A row's later change in a later part
    (a TOASTed value kept across a move, a delete then a re-insert, a TRUNCATE of the other
    table, and changes after it) lands after its earlier one."""
    monkeypatch.setattr("replicator.cdc.drain.BATCH_CHANGES", 4)
    _create(writer, schema, "orders", rows=20)
    _create(writer, schema, "items", rows=20)
    _create(writer, schema, "extra", rows=5)  # its first change comes in a late part
    big = "".join(uuid.uuid4().hex for _ in range(600))  # stored out of line
    _run(writer, schema, "UPDATE {t} SET big = %s || id WHERE id <= 3", big)
    _config(cdc_project, schema, "orders", "items", "extra")
    _sync(cdc_project)
    with writer.transaction():
        for n in range(1, 11):
            _run(writer, schema, "UPDATE {t} SET amount = %s WHERE id = %s", n, n)
            _run(
                writer, schema, "UPDATE {t} SET note = %s WHERE id = %s", f"i{n}", n, table="items"
            )
        for n in range(1, 4):  # a TOASTed row moved to a new key, then touched
            _run(writer, schema, "UPDATE {t} SET id = id + 100 WHERE id = %s", n)
            _run(writer, schema, "UPDATE {t} SET note = 'moved' WHERE id = %s", n + 100)
        _run(writer, schema, "DELETE FROM {t} WHERE id = 15", table="items")
        _run(writer, schema, "INSERT INTO {t} VALUES (15, 'back', 1, NULL)", table="items")
        _run(writer, schema, "TRUNCATE {t}", table="items")
        _run(writer, schema, "INSERT INTO {t} VALUES (7, 'after', 2, NULL)", table="items")
        _run(
            writer, schema, "INSERT INTO {t} SELECT g, 'x', g, NULL FROM generate_series(40, 60) g"
        )
        _run(writer, schema, "UPDATE {t} SET note = 'late' WHERE id = 1", table="extra")
    synced = _sync(cdc_project, "-vv")
    parts = synced.stderr.count("cdc: part of a batch")
    assert parts >= 5, synced.stderr
    assert assert_same_table(source_conn, dest_conn, schema, "orders") == 41
    assert assert_same_table(source_conn, dest_conn, schema, "items") == 1
    assert assert_same_table(source_conn, dest_conn, schema, "extra") == 5
    # items changed in early parts only: its position is the batch's end all the same, or a
    # re-read of the transaction (after a kill before the slot moves) would apply it again
    positions = dict(
        dest_conn.execute(
            "SELECT table_name, applied_lsn FROM _replicator.cdc_applied WHERE schema_name = %s",
            (schema,),
        ).fetchall()
    )
    assert positions["items"] == positions["orders"] == positions["extra"], positions
    _run(writer, schema, "UPDATE {t} SET note = 'later' WHERE id = 101")  # and it goes on
    _sync(cdc_project)
    assert_same_table(source_conn, dest_conn, schema, "orders")


def test_a_transaction_across_two_tables_and_a_copied_project(
    cdc_project, schema, writer, source_conn, dest_conn, tmp_path
):
    _create(writer, schema, "orders")
    _create(writer, schema, "items")
    _config(cdc_project, schema, "orders", "items")
    _sync(cdc_project)
    with writer.transaction():
        _run(writer, schema, "UPDATE {t} SET amount = amount + 1 WHERE id < 5", table="orders")
        _run(writer, schema, "DELETE FROM {t} WHERE id < 5", table="items")
    _sync(cdc_project)
    assert_same_table(source_conn, dest_conn, schema, "orders")
    assert assert_same_table(source_conn, dest_conn, schema, "items") == 96

    # The project folder copied elsewhere continues from the same slot.
    import shutil

    copy = tmp_path / "copy"
    shutil.copytree(cdc_project.path, copy)
    slot = json.loads((copy / "sync-state" / "cdc.json").read_text())["slot"]
    confirmed = "SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = %s"
    (before,) = source_conn.execute(confirmed, (slot,)).fetchone()
    _run(writer, schema, "INSERT INTO {t} VALUES (777, 'seen by the copy', 1, NULL)", table="items")
    result = cdc_project.run.__func__(type(cdc_project)(copy, cdc_project.env), "sync")
    assert result.exit_code == 0, result.output
    assert "items: incremental" in result.stderr
    assert assert_same_table(source_conn, dest_conn, schema, "items") == 97
    # the copy read the project's own slot (other tests' slots on this source do not count)
    assert json.loads((copy / "sync-state" / "cdc.json").read_text())["slot"] == slot
    moved = "SELECT confirmed_flush_lsn > %s::pg_lsn FROM pg_replication_slots WHERE slot_name = %s"
    assert source_conn.execute(moved, (before, slot)).fetchone() == (True,)


def test_writers_during_the_first_load_are_neither_lost_nor_applied_twice(
    cdc_project, schema, pg_servers, source_conn, dest_conn
):
    import threading

    import psycopg

    with psycopg.connect(pg_servers.source_url, autocommit=True) as setup:
        _create(setup, schema, rows=20_000)
    _config(cdc_project, schema, "orders")
    stop = threading.Event()
    written = []

    def write() -> None:
        with psycopg.connect(pg_servers.source_url, autocommit=True) as conn:
            conn.execute("SET synchronous_commit = on")
            n = 0
            while not stop.is_set():
                n += 1
                with conn.transaction():
                    _run(conn, schema, "INSERT INTO {t} VALUES (%s, 'w', %s, NULL)", 100_000 + n, n)
                    _run(
                        conn,
                        schema,
                        "UPDATE {t} SET amount = amount + 1 WHERE id = %s",
                        n % 500 + 1,
                    )
                    _run(conn, schema, "DELETE FROM {t} WHERE id = %s", 19_000 + n)
                written.append(n)

    thread = threading.Thread(target=write)
    thread.start()
    try:
        _sync(cdc_project)  # the first load, with Spark, while the writer runs
        _sync(cdc_project)
    finally:
        stop.set()
        thread.join()
    assert len(written) > 10
    _sync(cdc_project)
    assert_same_table(source_conn, dest_conn, schema, "orders")


def test_hostile_identifiers(cdc_project, schema, writer, source_conn, dest_conn):
    table = 'Order "Lines" 😀'
    target = sql.Identifier(schema, table)
    writer.execute(
        sql.SQL('CREATE TABLE {} ("Id %s" int PRIMARY KEY, "Note, ""x""" text)').format(target)
    )
    writer.execute(sql.SQL("INSERT INTO {} VALUES (1, 'a\tb\\c\nd'), (2, NULL)").format(target))
    name = f'{schema}."Order ""Lines"" 😀"'
    cdc_project.write_config({"tables": [{"name": name, "mode": "cdc"}]})
    _sync(cdc_project)
    writer.execute(
        sql.SQL('UPDATE {} SET "Note, ""x""" = E\'\\\\N\' WHERE "Id %s" = 2').format(target)
    )
    writer.execute(sql.SQL("INSERT INTO {} VALUES (3, '')").format(target))
    writer.execute(sql.SQL('DELETE FROM {} WHERE "Id %s" = 1').format(target))
    assert ": incremental, 3 rows" in _sync(cdc_project).stderr
    assert assert_same_table(source_conn, dest_conn, schema, table, key="Id %s") == 2


def _slot(project):
    return json.loads((project.path / "sync-state" / "cdc.json").read_text())["slot"]


def test_check_status_and_cdc_drop(cdc_project, schema, writer, source_conn, dest_conn):
    _create(writer, schema)
    writer.execute(sql.SQL("CREATE TABLE {} (n int)").format(sql.Identifier(schema, "nokey")))
    _config(cdc_project, schema, "orders", "nokey")
    checked = cdc_project.run("check")
    assert "ok    cdc: wal_level is logical" in checked.output
    assert "warn  cdc: max_slot_wal_keep_size is unlimited" in checked.output
    assert (
        "ok    cdc: no slot yet: the first sync creates the slot and publication" in checked.output
    )
    assert f"ok    {schema}.orders: replica identity default: the log names its rows" in (
        checked.output
    )
    assert f"error {schema}.nokey: the source table has no primary key" in checked.output
    synced = cdc_project.run("sync")
    assert synced.exit_code == 1  # nokey fails, and is never added to the publication
    publication = json.loads((cdc_project.path / "sync-state" / "cdc.json").read_text())
    published = source_conn.execute(
        "SELECT tablename FROM pg_publication_tables WHERE pubname = %s",
        (publication["publication"],),
    ).fetchall()
    assert published == [("orders",)]
    writer.execute(sql.SQL("DELETE FROM {}").format(sql.Identifier(schema, "nokey")))  # allowed

    _run(writer, schema, "UPDATE {t} SET note = repeat('x', 1000)")
    status = cdc_project.run("status", "--json")
    row = next(r for r in json.loads(status.stdout) if r["name"].endswith("orders"))
    assert row["mode"] == "cdc" and row["cursor"].count("/") == 1
    assert row["slot_lag_bytes"] > 100_000
    grid = cdc_project.run("status").output
    assert f"cdc: slot {_slot(cdc_project)} retains" in grid

    dropped = cdc_project.run("cdc", "drop")
    assert dropped.exit_code == 0, dropped.output
    assert "dropped replication slot" in dropped.output
    assert not source_conn.execute(
        "SELECT 1 FROM pg_replication_slots WHERE slot_name = %s", (publication["slot"],)
    ).fetchall()
    _config(cdc_project, schema, "orders")
    again = _sync(cdc_project)
    assert "full_reload" in again.stderr and "reason: slot dropped" in again.stderr
    assert assert_same_table(source_conn, dest_conn, schema, "orders") == 100


def test_follow_applies_changes_until_sigterm_and_sums_up_its_webhooks(
    cdc_project, schema, writer, source_conn, dest_conn, httpserver
):
    _create(writer, schema)
    hook = httpserver.url_for("/hook")
    _config(cdc_project, schema, "orders", webhook={"url": hook, "summary_interval": 3600})
    httpserver.expect_request("/hook", method="POST").respond_with_data("ok")
    follow = Follow(cdc_project, {"REPLICATOR_SPARK_MIN_ROWS": "10000000"})
    try:
        _run(writer, schema, "DELETE FROM {t} WHERE id <= 50")
        _run(writer, schema, "INSERT INTO {t} VALUES (500, 'followed', 1, NULL)")
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and _copied_rows(dest_conn, schema) != 51:
            time.sleep(0.2)
        assert_same_table(source_conn, dest_conn, schema, "orders")
        # Two more runs after the one that applied the changes, however slow the machine:
        # their successes are summed up in the post sent when the signal stops it. The run
        # that applied them may not have said it finished yet (its commit comes first): the
        # runs finished now, that one, then two more.
        finished = follow.runs_finished()
        while time.monotonic() < deadline and follow.runs_finished() < finished + 3:
            time.sleep(0.1)
    finally:
        code, stderr = follow.stop(signal.SIGTERM)
    assert code == 0, stderr[-3000:]
    assert "follow: stopped by a signal after" in stderr
    assert "cdc: slot" in stderr and "bytes of log written since" in stderr
    posts = [request.get_json() for request, _ in httpserver.log]
    assert len(posts) == 2, [p.get("runs") for p in posts]  # the first run, then a summary
    assert posts[0]["runs"] == 1 and posts[1]["runs"] >= 2
    assert all(p["event"] == "sync.finished" and p["status"] == "success" for p in posts)


def _copied_rows(dest_conn, schema):
    if dest_conn.execute("SELECT to_regclass(%s)", (f'"{schema}".orders',)).fetchone()[0] is None:
        return 0
    return dest_conn.execute(
        sql.SQL("SELECT count(*) FROM {}").format(sql.Identifier(schema, "orders"))
    ).fetchone()[0]


def test_a_reload_of_one_table_while_another_keeps_its_changes(
    cdc_project, schema, writer, source_conn, dest_conn
):
    _create(writer, schema, "orders")
    _create(writer, schema, "items")
    _config(cdc_project, schema, "orders", "items")
    _sync(cdc_project)
    _run(writer, schema, "UPDATE {t} SET note = 'pending'", table="items")
    _run(writer, schema, "UPDATE {t} SET note = 'reloaded'", table="orders")
    compiled = cdc_project.run("compile")
    assert compiled.exit_code == 0, compiled.output
    reloaded = _sync(cdc_project, "-f", "-s", "orders")  # items is not selected: kept for later
    assert "reason: --full-refresh" in reloaded.stderr
    _run(writer, schema, "UPDATE {t} SET amount = 0 WHERE id = 1", table="orders")
    writer.execute(
        sql.SQL("ALTER TABLE {} ADD COLUMN extra int DEFAULT 7").format(
            sql.Identifier(schema, "items")
        )
    )
    _run(writer, schema, "DELETE FROM {t} WHERE id = 2", table="items")
    synced = _sync(cdc_project)
    assert "items: full_reload" in synced.stderr and "reason: schema changed" in synced.stderr
    assert "orders: incremental, 1 rows" in synced.stderr
    assert_same_table(source_conn, dest_conn, schema, "orders")
    assert assert_same_table(source_conn, dest_conn, schema, "items") == 99


def test_a_table_loaded_in_the_run_that_drains_another_loses_nothing(
    cdc_project, schema, pg_servers, source_conn, dest_conn
):
    """orders goes on from the log while items has its first load in the same run, with a
    writer changing items throughout: the drain for orders must keep items' changes made
    after items' snapshot in the slot (items applies them at its next run)."""
    import threading

    import psycopg

    with psycopg.connect(pg_servers.source_url, autocommit=True) as setup:
        _create(setup, schema, "orders")
        _create(setup, schema, "items", rows=20_000)
    _config(cdc_project, schema, "orders")
    _sync(cdc_project)
    _config(cdc_project, schema, "orders", "items")
    stop = threading.Event()

    def write() -> None:
        with psycopg.connect(pg_servers.source_url, autocommit=True) as conn:
            conn.execute("SET synchronous_commit = on")
            n = 0
            while not stop.is_set():
                n += 1
                _run(
                    conn,
                    schema,
                    "UPDATE {t} SET amount = %s WHERE id = %s",
                    n,
                    n % 20_000 + 1,
                    table="items",
                )
                _run(conn, schema, "UPDATE {t} SET amount = %s WHERE id = %s", n, n % 100 + 1)

    thread = threading.Thread(target=write)
    thread.start()
    try:
        both = _sync(cdc_project)  # items: first load; orders: the drain
        assert "items: full_reload" in both.stderr and "orders: incremental" in both.stderr
    finally:
        stop.set()
        thread.join()
    _sync(cdc_project)
    assert_same_table(source_conn, dest_conn, schema, "orders")
    assert_same_table(source_conn, dest_conn, schema, "items")


def test_json_columns_take_updates(cdc_project, schema, writer, source_conn, dest_conn):
    target = sql.Identifier(schema, "docs")
    writer.execute(
        sql.SQL("CREATE TABLE {} (id int PRIMARY KEY, body json, at point)").format(target)
    )
    writer.execute(sql.SQL("""INSERT INTO {} VALUES (1, '{{"a": 1}}', '(1,2)')""").format(target))
    cdc_project.write_config({"tables": [{"name": f"{schema}.docs", "mode": "cdc"}]})
    _sync(cdc_project)
    writer.execute(sql.SQL("""UPDATE {} SET body = '{{"a":  2}}', at = '(3,4)'""").format(target))
    _sync(cdc_project)
    assert assert_same_table(source_conn, dest_conn, schema, "docs") == 1


def test_a_table_that_cannot_apply_reloads_and_does_not_stop_the_others(
    cdc_project, schema, writer, source_conn, dest_conn
):
    _create(writer, schema, "orders", rows=5)
    _create(writer, schema, "items")
    big = "".join(uuid.uuid4().hex for _ in range(600))
    _run(writer, schema, "UPDATE {t} SET big = %s", big)
    _config(cdc_project, schema, "orders", "items")
    _sync(cdc_project)
    dest_conn.execute(
        sql.SQL("DELETE FROM {} WHERE id = 1").format(sql.Identifier(schema, "orders"))
    )
    _run(writer, schema, "UPDATE {t} SET note = 'needs the TOASTed value' WHERE id = 1")
    _run(writer, schema, "UPDATE {t} SET note = 'goes on'", table="items")
    failed = cdc_project.run("sync")
    assert failed.exit_code == 1
    assert "left a TOASTed value as it was, which the copy does not hold either" in failed.stderr
    assert "items: incremental, 100 rows" in failed.stderr
    assert_same_table(source_conn, dest_conn, schema, "items")
    _run(writer, schema, "UPDATE {t} SET note = 'and on'", table="items")
    healed = _sync(cdc_project)
    assert "reason: the log could not be applied: " in healed.stderr, healed.stderr
    assert_same_table(source_conn, dest_conn, schema, "orders")
    assert_same_table(source_conn, dest_conn, schema, "items")


def test_a_table_left_out_by_select_does_not_stop_the_one_selected(
    cdc_project, schema, writer, source_conn, dest_conn, monkeypatch
):
    monkeypatch.setattr("replicator.cdc.drain.BATCH_CHANGES", 5)  # many small batches
    _create(writer, schema, "orders")
    _create(writer, schema, "items")
    _config(cdc_project, schema, "orders", "items")
    _sync(cdc_project)
    for n in range(1, 21):
        _run(writer, schema, "UPDATE {t} SET amount = %s WHERE id = %s", n, n, table="items")
    for n in range(1, 21):
        _run(writer, schema, "UPDATE {t} SET amount = %s WHERE id = %s", n, n)
    only = _sync(cdc_project, "-s", "orders")
    assert "orders: incremental, 20 rows" in only.stderr
    assert_same_table(source_conn, dest_conn, schema, "orders")
    later = _sync(cdc_project, "-s", "items")  # its changes waited in the slot
    assert "items: incremental, 20 rows" in later.stderr
    assert_same_table(source_conn, dest_conn, schema, "items")


def test_a_not_null_domain_column_takes_deletes(
    cdc_project, schema, writer, source_conn, dest_conn
):
    """A NOT NULL domain over a domain over varchar(20): deletes carry no value for it, and
    the updates compare the copy's row through the base type, as `compile` shows."""
    inner, domain = sql.Identifier(schema, "short"), sql.Identifier(schema, "label")
    target = sql.Identifier(schema, "tagged")
    writer.execute(sql.SQL("CREATE DOMAIN {} AS varchar(20) CHECK (VALUE <> '')").format(inner))
    writer.execute(sql.SQL("CREATE DOMAIN {} AS {} NOT NULL").format(domain, inner))
    writer.execute(sql.SQL("CREATE TABLE {} (id int PRIMARY KEY, tag {})").format(target, domain))
    writer.execute(
        sql.SQL("INSERT INTO {} SELECT g, 't' || g FROM generate_series(1, 10) g").format(target)
    )
    cdc_project.write_config({"tables": [{"name": f"{schema}.tagged", "mode": "cdc"}]})
    _sync(cdc_project)
    (document,) = json.loads(cdc_project.run("compile", "--json").stdout)
    (update,) = [s["sql"] for s in document["script"]["cdc_apply"] if s["sql"].startswith("UPDATE")]
    assert '"d"."tag"::character varying(20)' in update, update
    writer.execute(sql.SQL("DELETE FROM {} WHERE id <= 3").format(target))  # the log: key only
    writer.execute(sql.SQL("UPDATE {} SET tag = 'changed' WHERE id = 4").format(target))
    synced = _sync(cdc_project, "-v")
    assert assert_same_table(source_conn, dest_conn, schema, "tagged") == 7
    assert update.replace('"replicator_last"', '"replicator_stage_0"') in synced.stderr


def test_a_shape_change_seen_only_in_the_log_reloads_the_table(
    cdc_project, schema, writer, source_conn, dest_conn
):
    """DDL committed after a run planned the table but before its drain: the log's own
    Relation message says the table changed shape; that table is reloaded, none lost."""
    from replicator.base.identifiers import TableName
    from replicator.cdc.capture_table import CaptureTable
    from replicator.cdc.drain import drain
    from replicator.cdc.source.slot import flushed_lsn, slot_info
    from replicator.plan.inspect_table import inspect_source
    from replicator.project.project import Project

    _create(writer, schema)
    _config(cdc_project, schema, "orders")
    _sync(cdc_project)
    project = Project.load(cdc_project.path)
    table = project.config.tables[0]
    _, planned_before = inspect_source(source_conn, table, project.templates)  # the plan's view
    writer.execute(
        sql.SQL("ALTER TABLE {} ADD COLUMN region text").format(sql.Identifier(schema, "orders"))
    )
    _run(writer, schema, "UPDATE {t} SET region = 'eu' WHERE id = 1")
    names = json.loads((cdc_project.path / "sync-state" / "cdc.json").read_text())
    (applied,) = dest_conn.execute(
        "SELECT applied_lsn - '0/0'::pg_lsn FROM _replicator.cdc_applied WHERE schema_name = %s",
        (schema,),
    ).fetchone()
    captured = CaptureTable(TableName(schema, "orders"), planned_before, int(applied))
    drained = drain(
        cdc_project.env["REPLICATOR_SOURCE_URL"],
        cdc_project.env["REPLICATOR_DEST_URL"],
        names["slot"],
        names["publication"],
        [captured],
        slot_info(source_conn, names["slot"]).confirmed,
        flushed_lsn(source_conn),
    )
    assert captured.drift == "in the log: region added" and captured.changes == 0
    assert drained.end > 0
    synced = _sync(cdc_project)
    assert "reason: schema changed" in synced.stderr
    assert assert_same_table(source_conn, dest_conn, schema, "orders") == 100


def test_a_table_back_in_the_config_reloads_instead_of_missing_changes(
    cdc_project, schema, writer, source_conn, dest_conn
):
    """Out of the config, a table leaves the publication: its changes meanwhile are in no
    log. Back in, its copy reloads (found by a newcomer trial: it went on from its old
    position, and the update below was never applied)."""
    _create(writer, schema, "orders")
    _create(writer, schema, "items")
    _config(cdc_project, schema, "orders", "items")
    _sync(cdc_project)
    _config(cdc_project, schema, "items")
    assert "removed" in _sync(cdc_project).stderr
    _run(writer, schema, "UPDATE {t} SET note = 'while out of the config' WHERE id = 3")
    _config(cdc_project, schema, "orders", "items")
    back = _sync(cdc_project)
    assert f"{schema}.orders: full_reload" in back.stderr, back.stderr
    assert "reason: back among the cdc tables: the slot moved on" in back.stderr
    assert_same_table(source_conn, dest_conn, schema, "orders")


def test_a_table_back_in_the_config_of_a_dba_slot_reloads(
    cdc_project, schema, writer, source_conn, dest_conn
):
    """With a DBA's slot and publication (`create: false`) the table stays published while
    it is out of the config, and the slot moves past its changes: back in, its copy reloads
    (it went on from its old position and kept a deleted row and old versions for good)."""
    slot = f"dba_{uuid.uuid4().hex[:12]}"
    _create(writer, schema, "orders")
    _create(writer, schema, "items")
    source_conn.execute(
        sql.SQL("CREATE PUBLICATION {} FOR TABLE {}, {}").format(
            sql.Identifier(slot), sql.Identifier(schema, "orders"), sql.Identifier(schema, "items")
        )
    )
    source_conn.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (slot,))
    dba = {"slot": slot, "publication": slot, "create": False}
    _config(cdc_project, schema, "orders", "items", cdc=dba)
    _sync(cdc_project)
    _config(cdc_project, schema, "items", cdc=dba)
    _run(writer, schema, "DELETE FROM {t} WHERE id = 1")
    for n in range(3):
        _run(writer, schema, "UPDATE {t} SET note = %s WHERE id = 2", f"version {n}")
    _run(writer, schema, "UPDATE {t} SET note = 'items too' WHERE id = 2", table="items")
    _sync(cdc_project)  # drains items; the slot moves past the orders changes
    _config(cdc_project, schema, "orders", "items", cdc=dba)
    status = {r["name"]: r for r in json.loads(cdc_project.run("status", "--json").stdout)}
    assert status[f"{schema}.orders"]["next_action"].startswith("full_reload: back among")
    back = _sync(cdc_project)
    assert f"{schema}.orders: full_reload" in back.stderr, back.stderr
    assert "reason: back among the cdc tables: the slot moved on" in back.stderr
    assert_same_table(source_conn, dest_conn, schema, "orders")
    assert_same_table(source_conn, dest_conn, schema, "items")
    _run(writer, schema, "UPDATE {t} SET note = 'after' WHERE id = 5")
    again = _sync(cdc_project)
    assert f"{schema}.orders: incremental" in again.stderr, again.stderr
    assert_same_table(source_conn, dest_conn, schema, "orders")
    source_conn.execute("SELECT pg_drop_replication_slot(%s)", (slot,))
    source_conn.execute(sql.SQL("DROP PUBLICATION {}").format(sql.Identifier(slot)))


def test_a_slot_the_dba_makes_again_reloads_the_copies(
    cdc_project, schema, writer, source_conn, dest_conn
):
    """A slot named in `cdc` (create: false) that disappears, then is made again by hand,
    starts after the copies' positions: the changes in between are in no slot, so the copies
    reload (found by a newcomer trial: the next sync went on and lost them)."""
    slot = f"dba_{uuid.uuid4().hex[:12]}"
    _create(writer, schema)
    _dba_slot(source_conn, schema, slot, "orders")
    _config(cdc_project, schema, "orders", cdc={"slot": slot, "publication": slot, "create": False})
    _sync(cdc_project)
    source_conn.execute("SELECT pg_drop_replication_slot(%s)", (slot,))  # by mistake
    _run(writer, schema, "UPDATE {t} SET note = 'in no slot' WHERE id = 3")
    missing = cdc_project.run("sync")
    assert missing.exit_code == 1
    assert f"create it (SELECT pg_create_logical_replication_slot('{slot}', 'pgoutput'))" in (
        missing.stderr
    )
    assert "the next sync then reloads every cdc table" in missing.stderr
    source_conn.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (slot,))
    again = _sync(cdc_project)
    assert "reason: slot lost" in again.stderr, again.stderr
    assert_same_table(source_conn, dest_conn, schema, "orders")


def test_a_table_the_log_cannot_carry_says_why(cdc_project, schema, writer):
    """Alone in the config, its own reason, not the set-up's "no table can be captured"."""
    writer.execute(
        sql.SQL(
            "CREATE TABLE {} (id int PRIMARY KEY, n int, "
            "twice int GENERATED ALWAYS AS (n * 2) STORED)"
        ).format(sql.Identifier(schema, "gen"))
    )
    _config(cdc_project, schema, "gen")
    failed = cdc_project.run("sync")
    assert failed.exit_code == 1
    assert "generated column" in failed.stderr, failed.stderr
    # compile and status say the same before a sync (they predicted a full reload)
    compiled = cdc_project.run("compile")
    assert compiled.exit_code == 1 and "generated column" in compiled.stdout, compiled.output
    status = json.loads(cdc_project.run("status", "--json").stdout)
    assert status[0]["next_action"].startswith("fail: ") and "generated" in status[0]["next_action"]


def test_renaming_the_slot_in_the_config_names_the_old_one_to_drop(
    cdc_project, schema, writer, source_conn, dest_conn
):
    _create(writer, schema)
    _config(cdc_project, schema, "orders")
    _sync(cdc_project)
    old = _slot(cdc_project)
    renamed = f"renamed_{uuid.uuid4().hex[:8]}"
    try:
        _config(cdc_project, schema, "orders", cdc={"slot": renamed})
        synced = _sync(cdc_project)
        assert f"replication slot {old} (made by this project) is no longer used" in (synced.stderr)
        assert f"SELECT pg_drop_replication_slot('{old}')" in synced.stderr
        assert_same_table(source_conn, dest_conn, schema, "orders")
    finally:
        source_conn.execute(
            "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots "
            "WHERE slot_name = %s",
            (old,),
        )


def test_check_names_what_the_publication_needs_from_the_role(
    cdc_project, schema, writer, source_conn, pg_servers
):
    """The first sync creates the publication (CREATE on the database) and adds the tables
    (only their owner may): `check` says so before a sync fails on it (newcomer trial)."""
    _create(writer, schema)
    _config(cdc_project, schema, "orders")
    role = f"loader_{uuid.uuid4().hex[:8]}"
    source_conn.execute(sql.SQL("CREATE ROLE {} LOGIN REPLICATION").format(sql.Identifier(role)))
    try:
        source_conn.execute(
            sql.SQL("GRANT USAGE ON SCHEMA {0} TO {1}; GRANT SELECT ON {2} TO {1}").format(
                sql.Identifier(schema), sql.Identifier(role), sql.Identifier(schema, "orders")
            )
        )
        url = pg_servers.source_url.replace("postgres@", f"{role}@", 1)
        checked = cdc_project.run("check", env={"REPLICATOR_SOURCE_URL": url})
        assert f"error cdc: role {role} lacks CREATE on database postgres" in checked.output
        assert f"fix: GRANT CREATE ON DATABASE postgres TO {role}" in checked.output
        assert f"error {schema}.orders: role {role} does not own the source table" in (
            checked.output
        )
        assert f"OWNER TO {role}" in checked.output
    finally:
        source_conn.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(role)))
        source_conn.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))


def test_a_dba_slot_and_publication_as_check_status_and_compile_see_them(
    cdc_project, schema, writer, source_conn, dest_conn
):
    """`create: false` before the first sync: `status` sees the DBA's slot (it said "no
    slot yet"), `check` fails a table the publication lacks (it said 0 errors, then the
    sync failed), and `state set-cursor` on a cdc table is a usage error that says cdc."""
    slot = f"dba_{uuid.uuid4().hex[:12]}"
    _create(writer, schema, "orders")
    _create(writer, schema, "items")
    source_conn.execute(
        sql.SQL("CREATE PUBLICATION {} FOR TABLE {}").format(
            sql.Identifier(slot), sql.Identifier(schema, "orders")
        )
    )
    source_conn.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (slot,))
    try:
        dba = {"slot": slot, "publication": slot, "create": False}
        _config(cdc_project, schema, "orders", "items", cdc=dba)
        status = cdc_project.run("status")
        assert f"cdc: slot {slot} retains" in status.stdout, status.stdout
        assert "no replication slot yet" not in status.stdout
        checked = cdc_project.run("check")
        assert checked.exit_code != 0
        assert f"error {schema}.items: not in publication {slot}" in checked.output
        assert f'fix: a DBA adds it: ALTER PUBLICATION "{slot}" ADD TABLE "{schema}"."items"' in (
            checked.output
        )
        assert f"error {schema}.orders" not in checked.output
        _config(cdc_project, schema, "orders", cdc=dba)
        _sync(cdc_project)
        cursor = cdc_project.run("state", "set-cursor", f"{schema}.orders", "0/0")
        assert cursor.exit_code == 2
        assert "mode cdc has no cursor to set" in cursor.stderr
        assert f"replicator refresh {schema}.orders" in cursor.stderr
    finally:
        source_conn.execute("SELECT pg_drop_replication_slot(%s)", (slot,))
        source_conn.execute(sql.SQL("DROP PUBLICATION {}").format(sql.Identifier(slot)))


def test_a_table_switched_to_cdc_reloads_as_compile_says(
    cdc_project, schema, writer, source_conn, dest_conn
):
    """full-refresh, then cdc: compile and status predict the reload the sync does (they
    said `incremental (cursor none ...)`)."""
    _create(writer, schema)
    cdc_project.write_config({"tables": [{"name": f"{schema}.orders", "mode": "full-refresh"}]})
    _sync(cdc_project)
    _config(cdc_project, schema, "orders")
    reason = "mode changed to cdc: the copy has no log position"
    compiled = cdc_project.run("compile")
    assert f"-- next sync: full_reload ({reason})" in compiled.stdout, compiled.stdout
    status = json.loads(cdc_project.run("status", "--json").stdout)
    assert status[0]["next_action"] == f"full_reload: {reason}"
    synced = _sync(cdc_project)
    assert f"{schema}.orders: full_reload" in synced.stderr and f"reason: {reason}" in synced.stderr
    _run(writer, schema, "UPDATE {t} SET note = 'later' WHERE id = 7")
    assert f"{schema}.orders: incremental" in _sync(cdc_project).stderr
    assert_same_table(source_conn, dest_conn, schema, "orders")


def test_only_cdc_tables_join_the_publication(cdc_project, schema, writer, source_conn):
    """A cursor table synced in the same run is not published (the first sync added it to
    the publication, and the next one removed it again)."""
    _create(writer, schema, "orders")
    writer.execute(
        sql.SQL("CREATE TABLE {} (id int PRIMARY KEY, updated_at timestamptz)").format(
            sql.Identifier(schema, "items")
        )
    )
    cdc_project.write_config(
        {
            "tables": [
                {"name": f"{schema}.items", "replication_key": "updated_at"},
                {"name": f"{schema}.orders", "mode": "cdc"},
            ]
        }
    )
    _sync(cdc_project)
    publication = json.loads((cdc_project.path / "sync-state" / "cdc.json").read_text())
    published = source_conn.execute(
        "SELECT tablename FROM pg_publication_tables WHERE pubname = %s",
        (publication["publication"],),
    ).fetchall()
    assert published == [("orders",)]
    assert "publication" not in _sync(cdc_project).stderr


def _dba_slot(source_conn, schema, name, *tables, plugin="pgoutput"):
    """A publication of `tables` and a slot, both called `name`, as a DBA makes them."""
    source_conn.execute(
        sql.SQL("CREATE PUBLICATION {} FOR TABLE {}").format(
            sql.Identifier(name), sql.SQL(", ").join(sql.Identifier(schema, t) for t in tables)
        )
    )
    source_conn.execute("SELECT pg_create_logical_replication_slot(%s, %s)", (name, plugin))


def _drop_dba_slots(source_conn, *names):
    for name in names:
        source_conn.execute(
            "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots "
            "WHERE slot_name = %s",
            (name,),
        )
        source_conn.execute(sql.SQL("DROP PUBLICATION IF EXISTS {}").format(sql.Identifier(name)))


def test_a_dba_publication_that_withholds_changes_fails_the_table_with_the_fix(
    cdc_project, schema, writer, source_conn
):
    """A DBA's publication without deletes, with a row filter or with a column list would
    silently lose changes (found by a newcomer trial: check said 0 errors, the copy kept
    deleted rows). check and the sync both say what it withholds and give the statements."""
    name = f"dba_{uuid.uuid4().hex[:12]}"
    _create(writer, schema)
    _dba_slot(source_conn, schema, name, "orders")
    pub, table = sql.Identifier(name), sql.Identifier(schema, "orders")
    try:
        _config(
            cdc_project, schema, "orders", cdc={"slot": name, "publication": name, "create": False}
        )
        for statement, says in (
            (
                "ALTER PUBLICATION {p} SET (publish = 'insert, update')",
                "it does not publish deletes or truncates",
            ),
            (
                "ALTER PUBLICATION {p} SET TABLE {t} WHERE (id > 10)",
                "a row filter (WHERE (id > 10)) leaves rows out",
            ),
            (
                "ALTER PUBLICATION {p} SET TABLE {t} (id, note)",
                "its column list leaves out amount, big",
            ),
        ):
            source_conn.execute(sql.SQL(statement).format(p=pub, t=table))
            checked = cdc_project.run("check")
            assert checked.exit_code == 1, checked.output
            assert f"publication {name} (named in tables-config.json `cdc`) withholds changes" in (
                checked.output
            )
            assert says in checked.output, checked.output
            synced = cdc_project.run("sync")
            assert synced.exit_code == 1 and says in synced.stderr, synced.stderr
            assert "fix" in checked.output and f'ALTER PUBLICATION "{name}"' in checked.output
            source_conn.execute(
                sql.SQL(
                    "ALTER PUBLICATION {p} SET (publish = 'insert, update, delete, truncate'); "
                    "ALTER PUBLICATION {p} SET TABLE {t}"
                ).format(p=pub, t=table)
            )
        assert cdc_project.run("check").exit_code == 0
        _sync(cdc_project)
    finally:
        _drop_dba_slots(source_conn, name)


def test_pointing_cdc_at_another_slot_reloads_every_copy(
    cdc_project, schema, writer, source_conn, dest_conn
):
    """The copies' positions are in the old slot's stream: a new slot holds none of the
    changes in between (a newcomer trial's sync went on and lost them). A slot of another
    plugin is refused with the statements that make it again."""
    first, second, decoded = (f"dba_{uuid.uuid4().hex[:12]}" for _ in range(3))
    _create(writer, schema)
    _dba_slot(source_conn, schema, first, "orders")
    try:
        _config(
            cdc_project,
            schema,
            "orders",
            cdc={"slot": first, "publication": first, "create": False},
        )
        _sync(cdc_project)
        _run(writer, schema, "UPDATE {t} SET note = 'between the slots' WHERE id = 4")
        _run(writer, schema, "DELETE FROM {t} WHERE id = 5")
        source_conn.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (second,))
        _config(
            cdc_project,
            schema,
            "orders",
            cdc={"slot": second, "publication": first, "create": False},
        )
        moved = _sync(cdc_project)
        assert f"reason: replication slot changed: {first} -> {second}" in moved.stderr, (
            moved.stderr
        )
        assert_same_table(source_conn, dest_conn, schema, "orders")
        source_conn.execute(
            "SELECT pg_create_logical_replication_slot(%s, 'test_decoding')", (decoded,)
        )
        _config(
            cdc_project,
            schema,
            "orders",
            cdc={"slot": decoded, "publication": first, "create": False},
        )
        for result, text in (
            (cdc_project.run("check"), "output"),
            (cdc_project.run("sync"), "stderr"),
        ):
            assert result.exit_code == 1
            said = getattr(result, text)
            assert f"replication slot {decoded} decodes with the test_decoding plugin" in said, said
            assert f"pg_create_logical_replication_slot('{decoded}', 'pgoutput')" in said
    finally:
        _drop_dba_slots(source_conn, first, second, decoded)


def test_status_and_compile_follow_a_table_between_cdc_and_a_cursor_mode(
    cdc_project, schema, writer, source_conn, dest_conn
):
    """A cursor table switched to cdc, and back: status crashed on the timestamp cursor
    (read as a log position), and compile and status predicted a failure (the log position
    cast to the key's type) where the sync reloads; each says the reload the sync does."""
    writer.execute(
        sql.SQL(
            "CREATE TABLE {t} (id int PRIMARY KEY, note text, updated_at timestamptz NOT NULL "
            "DEFAULT now()); INSERT INTO {t} (id, note) SELECT g, 'n' FROM generate_series(1, 30) g"
        ).format(t=sql.Identifier(schema, "orders"))
    )
    cursor = {"tables": [{"name": f"{schema}.orders", "replication_key": "updated_at"}]}
    cdc_project.write_config(cursor)
    _sync(cdc_project)
    for config, reason in (
        ({"tables": [{"name": f"{schema}.orders", "mode": "cdc"}]}, "mode changed to cdc"),
        (cursor, "schema changed: replication key changed: none -> updated_at"),
    ):
        cdc_project.write_config(config)
        status = cdc_project.run("status", "--json")
        assert status.exit_code == 0, status.output
        assert json.loads(status.stdout)[0]["next_action"].startswith(f"full_reload: {reason}")
        compiled = cdc_project.run("compile")
        assert compiled.exit_code == 0, compiled.output
        assert f"-- next sync: full_reload ({reason}" in compiled.stdout
        synced = _sync(cdc_project)
        assert f"{schema}.orders: full_reload" in synced.stderr
        assert f"reason: {reason}" in synced.stderr, synced.stderr
        assert_same_table(source_conn, dest_conn, schema, "orders")


def test_the_drain_says_the_position_its_result_starts_from(cdc_project, schema, writer):
    """A table without changes for a few runs: `applying the log (lsn X)` named its last
    applied change's position while the result said `lsn Y -> Z` (a newcomer trial)."""
    _create(writer, schema, "orders")
    _create(writer, schema, "items")
    _config(cdc_project, schema, "orders", "items")
    _sync(cdc_project)
    for n in range(2):  # changes to items only: the slot and orders' state move on
        _run(writer, schema, "UPDATE {t} SET note = %s WHERE id = 1", f"n{n}", table="items")
        _sync(cdc_project)
    _run(writer, schema, "UPDATE {t} SET note = 'now' WHERE id = 1")
    stderr = _sync(cdc_project, "--log-format", "json").stderr
    events = [json.loads(line) for line in stderr.splitlines()]
    orders = f"{schema}.orders"
    started = next(e for e in events if e.get("event") == "table.started" and e["name"] == orders)
    finished = next(e for e in events if e.get("event") == "table.finished" and e["name"] == orders)
    assert started["reason"] == f"lsn {finished['cursor_from']}", (started, finished)
    assert finished["reason"].startswith(f"lsn {finished['cursor_from']} -> ")


def test_rows_sharing_a_configured_primary_key_are_said_as_a_full_load_says_them(
    cdc_project, schema, writer, source_conn, dest_conn
):
    """REPLICA IDENTITY FULL with a `primary_key` the source does not hold unique: the copy
    keeps one row per key, and the drain warns as the first load does."""
    target = sql.Identifier(schema, "codes")
    writer.execute(sql.SQL("CREATE TABLE {} (code int NOT NULL, note text)").format(target))
    writer.execute(sql.SQL("ALTER TABLE {} REPLICA IDENTITY FULL").format(target))
    writer.execute(sql.SQL("INSERT INTO {} VALUES (1, 'a'), (2, 'b'), (2, 'b2')").format(target))
    cdc_project.write_config(
        {"tables": [{"name": f"{schema}.codes", "mode": "cdc", "primary_key": ["code"]}]}
    )
    loaded = _sync(cdc_project)
    assert "the model returned 1 row(s) whose primary key another row also has" in loaded.stderr
    writer.execute(sql.SQL("INSERT INTO {} VALUES (3, 'c')").format(target))
    quiet = _sync(cdc_project)
    assert "another row also has" not in quiet.stderr
    writer.execute(
        sql.SQL("INSERT INTO {} VALUES (1, 'again'), (3, 'c2'), (4, 'd')").format(target)
    )
    with writer.transaction():  # twice in one batch, and a row moved onto a taken key
        writer.execute(sql.SQL("INSERT INTO {} VALUES (5, 'e'), (5, 'e2')").format(target))
        writer.execute(sql.SQL("UPDATE {} SET code = 4 WHERE note = 'a'").format(target))
    said = _sync(cdc_project)
    assert (
        f"{schema}.codes: the log brought 4 row(s) whose primary key another row also has; "
        "kept the newest version of each key (`replicator verify` names the keys)" in said.stderr
    ), said.stderr
    copied = dest_conn.execute(
        sql.SQL("SELECT code, note FROM {} ORDER BY code").format(target)
    ).fetchall()
    # One row per key; the move's delete took key 1, which (1, 'again') also had: why the
    # warning matters.
    assert copied == [(2, "b2"), (3, "c2"), (4, "a"), (5, "e2")]
    named = cdc_project.run("verify", "--json")
    (verdict,) = json.loads(named.stdout)
    repeated = sorted(e["key"]["code"] for e in verdict["examples"] if e["kind"] == "repeated_key")
    assert repeated == [2, 3, 4, 5], verdict  # what the source holds twice now


def test_compile_shows_the_apply_a_sync_runs(cdc_project, schema, writer):
    _create(writer, schema, rows=5)
    _config(cdc_project, schema, "orders")
    _sync(cdc_project)
    compiled = cdc_project.run("compile", "--json")
    assert compiled.exit_code == 0, compiled.output
    (document,) = json.loads(compiled.stdout)
    steps = document["script"]["cdc_apply"]
    assert [s["sql"].split()[0] for s in steps] == [
        "BEGIN",
        "CREATE",
        "DELETE",
        "SELECT",
        "SET",
        "SET",
        "UPDATE",
        "RESET",
        "RESET",
        "INSERT",
        "INSERT",
        "COMMIT",
    ]
    assert document["sql"]["cdc_apply"][6].startswith(f'UPDATE "{schema}"."orders" AS d')
    assert document["sql"]["cdc_apply"][9].startswith(f'INSERT INTO "{schema}"."orders" AS d')
    assert "-- cdc apply of a batch" in cdc_project.run("compile").stdout
    with writer.transaction():  # a key twice in the batch: the reduction runs
        _run(writer, schema, "UPDATE {t} SET note = 'x' WHERE id = 1")
        _run(writer, schema, "UPDATE {t} SET note = 'y' WHERE id = 1")
    synced = _sync(cdc_project, "-v")
    for step in steps[1:10]:
        assert step["sql"] in synced.stderr, step["sql"]


def test_a_process_with_a_thousand_files_open_reads_the_log(
    cdc_project, schema, writer, source_conn, dest_conn
):
    """The stream's socket gets a descriptor numbered over 1023 here, which select() refuses
    ("filedescriptor out of range"): the drain waits on it with poll."""
    _create(writer, schema, rows=10)
    _config(cdc_project, schema, "orders")
    _sync(cdc_project)
    _run(writer, schema, "UPDATE {t} SET note = 'later' WHERE id <= 5")
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 2048:
        pytest.skip(f"this machine allows {hard} open files, fewer than the test needs")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 2048), hard))
    opened = []
    try:
        while not opened or opened[-1] < 1030:
            opened.append(os.open(os.devnull, os.O_RDONLY))
        _sync(cdc_project)
    finally:
        for fd in opened:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    assert assert_same_table(source_conn, dest_conn, schema, "orders") == 10


def test_the_log_prints_values_as_every_session_of_the_tool_does(
    cdc_project, schema, writer, source_conn, dest_conn
):
    """The stream's walsender is a session of its own: a role whose settings print dates
    day first, shorten floats and write bytea escaped must not reach the copy (the tool pins
    them on the replication connection, as on every other session)."""
    table = sql.Identifier(schema, "typed")
    writer.execute(
        sql.SQL(
            "CREATE TABLE {} (id int PRIMARY KEY, d date, ts timestamptz, f float8, b bytea, "
            "iv interval)"
        ).format(table)
    )
    insert = sql.SQL(
        "INSERT INTO {} VALUES (%s, DATE '2026-11-03', TIMESTAMPTZ '2026-11-03 04:05:06.789+00', "
        "0.1::float8 + 0.2, '\\x00ff0a'::bytea, INTERVAL '1 day 02:03:04')"
    ).format(table)
    writer.execute(insert, (1,))
    _config(cdc_project, schema, "typed")
    _sync(cdc_project)
    role = source_conn.execute("SELECT current_user").fetchone()[0]
    role_id = sql.Identifier(role)
    for setting in (
        "DateStyle = 'SQL, DMY'",
        "TimeZone = 'Pacific/Chatham'",
        "IntervalStyle = 'sql_standard'",
        "extra_float_digits = 0",
        "bytea_output = 'escape'",
    ):
        source_conn.execute(sql.SQL("ALTER ROLE {} SET ").format(role_id) + sql.SQL(setting))
    try:
        writer.execute(insert, (2,))
        _run(writer, schema, "UPDATE {t} SET f = f * 3, d = d + 1 WHERE id = 1", table="typed")
        _sync(cdc_project)
    finally:
        source_conn.execute(sql.SQL("ALTER ROLE {} RESET ALL").format(role_id))
    assert assert_same_table(source_conn, dest_conn, schema, "typed") == 2


def test_a_slot_still_held_by_a_walsender_on_its_way_out_is_waited_for(
    cdc_project, schema, writer, pg_servers, source_conn, dest_conn
):
    """A killed run's walsender lets go of the slot moments after: the next run's stream
    waits for it instead of failing its tables."""
    import psycopg
    from psycopg import pq

    _create(writer, schema)
    _config(cdc_project, schema, "orders")
    _sync(cdc_project)
    _run(writer, schema, "UPDATE {t} SET note = 'after' WHERE id <= 10")
    names = json.loads((cdc_project.path / "sync-state" / "cdc.json").read_text())
    holder = pq.PGconn.connect(f"{pg_servers.source_url}?replication=database".encode())
    holder.send_query(
        f"START_REPLICATION SLOT {names['slot']} LOGICAL 0/0 "
        f"(proto_version '1', publication_names '{names['publication']}')".encode()
    )
    assert holder.get_result().status == pq.ExecStatus.COPY_BOTH

    def release_once_the_sync_waits() -> None:
        with psycopg.connect(pg_servers.source_url, autocommit=True) as conn:
            deadline = time.monotonic() + 120
            while (
                time.monotonic() < deadline
                and not conn.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'walsender' "
                    "AND application_name = 'replicator'"
                ).fetchone()[0]
            ):
                time.sleep(0.05)
        holder.finish()

    releaser = threading.Thread(target=release_once_the_sync_waits)
    releaser.start()
    try:
        _sync(cdc_project)
    finally:
        releaser.join()
    assert assert_same_table(source_conn, dest_conn, schema, "orders") == 100


def test_a_long_apply_keeps_the_stream_alive(
    cdc_project, schema, writer, pg_servers, source_conn, dest_conn, monkeypatch
):
    """While a batch waits for a lock in the destination, the reader keeps sending status
    updates: the source does not end the stream as a dead client's before the drain has
    read the rest (wal_sender_timeout of 1 s from the URL, the lock held 3 s, a batch per
    transaction)."""
    import psycopg

    from replicator.cdc import drain
    from replicator.cdc.rows import stage

    monkeypatch.setattr(stage, "PING_EVERY_S", 0.2)
    monkeypatch.setattr(drain, "BATCH_CHANGES", 1)  # the stream goes on after the wait
    _create(writer, schema)
    _config(cdc_project, schema, "orders")
    _sync(cdc_project)
    for n in range(1, 11):
        _run(writer, schema, "UPDATE {t} SET note = 'late' WHERE id = %s", n)
    table = sql.Identifier(schema, "orders")
    waited = threading.Event()

    def hold_the_copy() -> None:
        with psycopg.connect(pg_servers.dest_url) as locker:
            locker.execute(sql.SQL("LOCK TABLE {} IN SHARE MODE").format(table))
            deadline = time.monotonic() + 120
            while (
                time.monotonic() < deadline
                and not locker.execute(
                    "SELECT count(*) FROM pg_locks WHERE relation = %s::regclass AND NOT granted",
                    (table.as_string(locker),),
                ).fetchone()[0]
            ):
                time.sleep(0.05)
            waited.set()
            time.sleep(3)  # three times the stream's timeout
            locker.rollback()

    holder = threading.Thread(target=hold_the_copy)
    holder.start()
    try:
        url = cdc_project.env["REPLICATOR_SOURCE_URL"] + "?options=-c%20wal_sender_timeout%3D1s"
        result = cdc_project.run("sync", env={"REPLICATOR_SOURCE_URL": url})
    finally:
        holder.join()
    assert waited.is_set()
    assert result.exit_code == 0, result.output
    assert assert_same_table(source_conn, dest_conn, schema, "orders") == 100


def test_a_transaction_committed_after_the_reading_point_is_the_next_runs(
    cdc_project, schema, writer, pg_servers, source_conn, dest_conn, monkeypatch
):
    """A transaction open when the run begins and committed before its stream starts: the
    stream stops at its Begin (cut, not read to its end), the slot is free when the run
    returns, and the next run applies it once."""
    import psycopg

    from replicator.cdc import drain

    _create(writer, schema)
    _config(cdc_project, schema, "orders")
    _sync(cdc_project)
    late = psycopg.connect(pg_servers.source_url)
    late.execute("SET synchronous_commit = on")
    _run(
        late, schema, "INSERT INTO {t} SELECT g, 'late', g, NULL FROM generate_series(101, 20100) g"
    )
    _run(writer, schema, "UPDATE {t} SET note = 'before' WHERE id = 1")
    (read_from,) = source_conn.execute("SELECT pg_current_wal_flush_lsn()").fetchone()
    start = drain.LogStream.start

    def start_after_the_commit(stream, position):
        late.commit()  # after the run's reading point, flushed before the stream decodes
        return start(stream, position)

    monkeypatch.setattr(drain.LogStream, "start", start_after_the_commit)
    try:
        _sync(cdc_project)
    finally:
        late.close()
    target = sql.Identifier(schema, "orders")
    assert dest_conn.execute(
        sql.SQL(
            "SELECT count(*) FILTER (WHERE id > 100), max(note) FILTER (WHERE id = 1) FROM {}"
        ).format(target)
    ).fetchone() == (0, "before")
    # free, and past the update the run applied (by its status, or, when the cut walsender
    # never read that, moved by the drain itself): the WAL before it is let go
    assert source_conn.execute(
        "SELECT active_pid, confirmed_flush_lsn >= %s FROM pg_replication_slots "
        "WHERE slot_name = %s",
        (read_from, _slot(cdc_project)),
    ).fetchone() == (None, True)
    monkeypatch.undo()
    _sync(cdc_project)
    assert assert_same_table(source_conn, dest_conn, schema, "orders") == 20_100


def test_a_batch_applied_in_parts_closes_at_its_transaction_s_commit(
    cdc_project, schema, writer, source_conn, dest_conn
):
    """A transaction bigger than the drain's first batch (12,500 changes) is applied in
    parts, in a destination transaction that stays open until the batch ends: the batch
    ends at that transaction's commit, not with the transactions after it."""
    _create(writer, schema, "orders", rows=10)
    _config(cdc_project, schema, "orders")
    _sync(cdc_project)
    _run(
        writer, schema, "INSERT INTO {t} SELECT g, 'big', g, NULL FROM generate_series(11, 20010) g"
    )
    for n in range(10):
        _run(writer, schema, "UPDATE {t} SET amount = %s WHERE id %% 10 = %s", n, n)
    synced = _sync(cdc_project, "-vv")
    assert "cdc: part of a batch" in synced.stderr
    assert "cdc: batch of 20000 change(s)" in synced.stderr, synced.stderr[-3000:]
    assert assert_same_table(source_conn, dest_conn, schema, "orders") == 20_010


def test_changes_logged_while_the_replica_identity_named_other_columns_reload_the_copy(
    cdc_project, schema, writer, source_conn, dest_conn
):
    """A copy keyed by `code` (REPLICA IDENTITY FULL, the source's key is `id`): the
    identity switched to DEFAULT for a while, changes made then name their rows by `id`
    only, and the identity back to FULL. Those changes cannot be applied by `code` (the
    old rows would stay): the log's own description of the table says so, and the copy
    reloads instead (a newcomer trial found the stale rows)."""
    target = sql.Identifier(schema, "ck")
    writer.execute(
        sql.SQL("CREATE TABLE {} (id int PRIMARY KEY, code text NOT NULL, v int)").format(target)
    )
    writer.execute(
        sql.SQL("INSERT INTO {} SELECT g, 'c' || g, g FROM generate_series(1, 100) g").format(
            target
        )
    )
    writer.execute(sql.SQL("ALTER TABLE {} REPLICA IDENTITY FULL").format(target))
    cdc_project.write_config(
        {"tables": [{"name": f"{schema}.ck", "mode": "cdc", "primary_key": ["code"]}]}
    )
    _sync(cdc_project)
    writer.execute(sql.SQL("ALTER TABLE {} REPLICA IDENTITY DEFAULT").format(target))
    writer.execute(
        sql.SQL("UPDATE {} SET code = code || 'w' WHERE id BETWEEN 21 AND 23").format(target)
    )
    writer.execute(sql.SQL("DELETE FROM {} WHERE id = 24").format(target))
    refused = cdc_project.run("sync")
    assert refused.exit_code == 1, refused.output  # said at the set-up, as before
    writer.execute(sql.SQL("ALTER TABLE {} REPLICA IDENTITY FULL").format(target))
    back = _sync(cdc_project)
    assert (
        f"{schema}.ck: full_reload" in back.stderr
        and "replica identity DEFAULT names rows by (id), not by the copy's key (code)"
        in back.stderr
    ), back.stderr
    assert assert_same_table(source_conn, dest_conn, schema, "ck", key="id") == 99
    writer.execute(sql.SQL("UPDATE {} SET v = -v WHERE id < 10").format(target))
    _sync(cdc_project)
    assert assert_same_table(source_conn, dest_conn, schema, "ck", key="id") == 99


@pytest.mark.parametrize(
    ("identity", "entry"),
    [("DEFAULT", {}), ("FULL", {}), ("FULL", {"primary_key": ["id", "v"]})],
    ids=["default", "full", "full-configured-wider-key"],
)
def test_a_deferrable_primary_key_is_refused_and_the_source_keeps_taking_updates(
    cdc_project, schema, writer, source_conn, dest_conn, identity, entry
):
    """A DEFERRABLE primary key lets two rows hold one key inside a transaction: `UPDATE
    SET id = id + 1` logged "a row left key 2" after "a row arrived at key 2", and the copy
    lost keys 2-5 of 1-5, exit 0 (REPLICA IDENTITY FULL). Under DEFAULT, PostgreSQL takes no
    deferrable key as the replica identity: the table joined the publication and the source
    refused the application's UPDATEs. The table is refused with the fix, left out of the
    publication, and the source takes its updates."""
    target = sql.Identifier(schema, "shifted")
    writer.execute(
        sql.SQL(
            "CREATE TABLE {} "
            "(id int CONSTRAINT shifted_key PRIMARY KEY DEFERRABLE, v text NOT NULL)"
        ).format(target)
    )
    writer.execute(sql.SQL("ALTER TABLE {} REPLICA IDENTITY " + identity).format(target))
    writer.execute(
        sql.SQL("INSERT INTO {} SELECT g, 'v' FROM generate_series(1, 5) g").format(target)
    )
    table = {"name": f"{schema}.shifted", "mode": "cdc", **entry}
    cdc_project.write_config({"tables": [table]})
    refused = cdc_project.run("sync")
    assert refused.exit_code == 1, refused.output
    fix = (
        f"ALTER TABLE {schema}.shifted DROP CONSTRAINT shifted_key, ADD CONSTRAINT shifted_key "
        "PRIMARY KEY (id)"
    )
    assert (
        "its primary key shifted_key is DEFERRABLE: inside a transaction two rows may hold one "
        "key (UPDATE ... SET id = id + 1), which changes applied by key cannot tell apart, so "
        f"the copy would lose rows: run `{fix}` in the source" in refused.stderr
    ), refused.stderr
    writer.execute(sql.SQL("UPDATE {} SET id = id + 1").format(target))  # not refused
    writer.execute(fix)
    _sync(cdc_project)
    writer.execute(sql.SQL("UPDATE {} SET v = 'w' WHERE id = 6").format(target))
    _sync(cdc_project)
    assert assert_same_table(source_conn, dest_conn, schema, "shifted") == 5


def test_a_deferrable_primary_key_beside_a_unique_index_checked_at_once_is_captured(
    cdc_project, schema, writer, source_conn, dest_conn
):
    """An immediate unique index over the key keeps two rows from ever holding one key,
    whatever the primary key defers: made the replica identity, the table is captured."""
    target = sql.Identifier(schema, "guarded")
    writer.execute(
        sql.SQL("CREATE TABLE {} (id int PRIMARY KEY DEFERRABLE, v text)").format(target)
    )
    writer.execute(sql.SQL("CREATE UNIQUE INDEX guarded_id ON {} (id)").format(target))
    writer.execute(sql.SQL("ALTER TABLE {} REPLICA IDENTITY USING INDEX guarded_id").format(target))
    writer.execute(
        sql.SQL("INSERT INTO {} SELECT g, 'v' FROM generate_series(1, 5) g").format(target)
    )
    cdc_project.write_config({"tables": [{"name": f"{schema}.guarded", "mode": "cdc"}]})
    _sync(cdc_project)
    writer.execute(sql.SQL("UPDATE {} SET v = 'w' WHERE id = 3").format(target))
    writer.execute(sql.SQL("UPDATE {} SET id = 10 WHERE id = 5").format(target))
    _sync(cdc_project)
    assert assert_same_table(source_conn, dest_conn, schema, "guarded") == 5


def _filtered_rows(conn, schema, where):
    return conn.execute(
        sql.SQL("SELECT id, note, md5(big) FROM {} WHERE " + where + " ORDER BY id").format(
            sql.Identifier(schema, "orders")
        )
    ).fetchall()


def test_a_row_the_where_filter_lets_in_without_its_toasted_value_reloads_the_copy(
    cdc_project, schema, writer, source_conn, dest_conn
):
    """An update that moves a row into the publication's row filter arrives as an insert
    that leaves its unchanged TOASTed value out (replica identity DEFAULT): the copy took the
    value of the key's deleted row and the sync exited 0. Now the table fails with why, and
    its next sync reloads it."""
    _create(writer, schema, rows=20)
    _run(writer, schema, "INSERT INTO {t} VALUES (150, 'outside', 1, NULL)")
    _run(writer, schema, "UPDATE {t} SET big = md5(id::text) || %s", _big_text())
    table = {"name": f"{schema}.orders", "mode": "cdc", "where": "id < 100"}
    cdc_project.write_config({"tables": [table]})
    _sync(cdc_project)
    with writer.transaction():
        _run(writer, schema, "DELETE FROM {t} WHERE id = 5")
        _run(writer, schema, "UPDATE {t} SET id = 5, note = 'in' WHERE id = 150")
    failed = cdc_project.run("sync")
    assert failed.exit_code == 1, failed.output
    assert "a row the table's row filter (`where`) let in by an update came without" in (
        failed.stderr
    )
    _sync(cdc_project)
    copied = _filtered_rows(dest_conn, schema, "true")
    assert copied == _filtered_rows(source_conn, schema, "id < 100") and len(copied) == 20


def test_a_key_move_before_a_truncate_in_the_batch_needs_no_toasted_value(
    cdc_project, schema, writer, source_conn, dest_conn
):
    """A move that kept a TOASTed value, then a TRUNCATE of the table, in one batch: the
    move was resolved against the emptied copy and failed the table (exit 1, a reload)."""
    _create(writer, schema, rows=5)
    _run(writer, schema, "UPDATE {t} SET big = md5(id::text) || %s", _big_text())
    _config(cdc_project, schema, "orders")
    _sync(cdc_project)
    _run(writer, schema, "UPDATE {t} SET id = 100 WHERE id = 1")
    _run(writer, schema, "TRUNCATE {t}")
    _run(writer, schema, "INSERT INTO {t} VALUES (7, 'after', 1, NULL)")
    said = _sync(cdc_project)
    assert "reload" not in said.stderr, said.stderr
    assert assert_same_table(source_conn, dest_conn, schema, "orders") == 1


def _big_text():
    return "".join(uuid.uuid4().hex for _ in range(600))  # incompressible: stored out of line
