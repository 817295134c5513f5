"""`mode: "cdc"`, the apply (cdc/apply, cdc/rows): every insert, update, delete and truncate from
the slot applied to the copy exactly once, in commit order, whatever the batch."""

from __future__ import annotations

import json
import uuid

import pytest
from cdc_tables import (
    big_text,
    configure_cdc,
    create_orders,
    on_table,
    slot_of,
)
from dbcompare import assert_same_table
from psycopg import sql

pytestmark = pytest.mark.spark


def _filtered_rows(conn, schema, where):
    return conn.execute(
        sql.SQL("SELECT id, note, md5(big) FROM {} WHERE " + where + " ORDER BY id").format(
            sql.Identifier(schema, "orders")
        )
    ).fetchall()


def test_inserts_updates_deletes_and_truncate_arrive_exactly_once(
    cdc_project, schema, writer, source_conn, dest_conn
):
    create_orders(writer, schema)
    configure_cdc(cdc_project, schema, "orders")
    first = cdc_project.sync()
    assert "full_reload" in first.stderr and "reason: no state" in first.stderr
    assert_same_table(source_conn, dest_conn, schema, "orders")

    on_table(writer, schema, "INSERT INTO {t} VALUES (1000, 'new', 1, NULL)")
    on_table(writer, schema, "UPDATE {t} SET note = 'changed' WHERE id <= 10")
    on_table(writer, schema, "DELETE FROM {t} WHERE id BETWEEN 20 AND 29")
    with writer.transaction():  # a key updated several times in one batch
        for value in ("a", "b", "c"):
            on_table(writer, schema, "UPDATE {t} SET note = %s WHERE id = 50", value)
    on_table(writer, schema, "DELETE FROM {t} WHERE id = 60")  # deleted, then back
    on_table(writer, schema, "INSERT INTO {t} VALUES (60, 'back', 6, NULL)")
    on_table(writer, schema, "UPDATE {t} SET id = 5000 WHERE id = 70")  # the key moves
    second = cdc_project.sync()
    assert "orders: incremental" in second.stderr, second.stderr
    assert assert_same_table(source_conn, dest_conn, schema, "orders") == 91

    third = cdc_project.sync()
    assert "orders: noop" in third.stderr

    on_table(writer, schema, "TRUNCATE {t}")
    on_table(writer, schema, "INSERT INTO {t} VALUES (1, 'after the truncate', 1, NULL)")
    fourth = cdc_project.sync()
    assert "; truncated" in fourth.stderr, fourth.stderr  # the log says the copy was emptied
    assert assert_same_table(source_conn, dest_conn, schema, "orders") == 1


def test_an_update_to_the_same_values_rewrites_nothing_but_a_new_spelling_arrives(
    cdc_project, schema, writer, source_conn, dest_conn
):
    """The log carries an update that wrote the same values: the copy's row is left as it is
    (no new row version). numeric's 3.00 equals 3.0 by `=` but prints otherwise: written."""
    create_orders(writer, schema, rows=6)
    configure_cdc(cdc_project, schema, "orders")
    cdc_project.sync()
    versions = sql.SQL("SELECT id, xmin::text FROM {} ORDER BY id").format(
        sql.Identifier(schema, "orders")
    )
    before = dict(dest_conn.execute(versions).fetchall())
    on_table(writer, schema, "UPDATE {t} SET note = note, amount = amount WHERE id <= 5")
    on_table(writer, schema, "UPDATE {t} SET amount = 3.00 WHERE id = 2")  # it was 3.0
    cdc_project.sync()
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
    create_orders(writer, schema, rows=rows)
    configure_cdc(cdc_project, schema, "orders")
    cdc_project.sync()
    target = sql.Identifier(schema, "orders")
    dest_conn.execute(sql.SQL("DELETE FROM {} WHERE id IN (3, 7)").format(target))
    on_table(writer, schema, "UPDATE {t} SET note = 'changed' WHERE id <= %s", rows - 3)
    cdc_project.sync()
    with writer.transaction():  # a key twice: the batch is reduced first
        on_table(writer, schema, "UPDATE {t} SET note = 'x' WHERE id = 7")
        on_table(writer, schema, "UPDATE {t} SET note = 'y' WHERE id = 7")
    cdc_project.sync()
    assert assert_same_table(source_conn, dest_conn, schema, "orders") == rows


def test_unchanged_toasted_values_keep_the_destinations(
    cdc_project, schema, writer, source_conn, dest_conn
):
    create_orders(writer, schema, rows=5)
    big = "".join(uuid.uuid4().hex for _ in range(600))  # incompressible: stored out of line
    on_table(writer, schema, "UPDATE {t} SET big = %s || id", big)
    configure_cdc(cdc_project, schema, "orders")
    cdc_project.sync()
    on_table(writer, schema, "UPDATE {t} SET note = 'touched' WHERE id IN (1, 2)")
    with writer.transaction():  # inserted and updated in one batch: the value is the insert's
        on_table(writer, schema, "INSERT INTO {t} VALUES (9, 'x', 1, %s)", big + "nine")
        on_table(writer, schema, "UPDATE {t} SET note = 'y' WHERE id = 9")
    on_table(writer, schema, "UPDATE {t} SET id = 30 WHERE id = 3")  # moved, value unchanged
    cdc_project.sync()
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
    cdc_project.sync()
    writer.execute(sql.SQL("UPDATE {} SET p = -p WHERE id IN (1, 2)").format(target))
    writer.execute(sql.SQL("UPDATE {} SET id = 30 WHERE id = 3").format(target))  # moved
    synced = cdc_project.sync()
    assert f"{schema}.pt: incremental" in synced.stderr, synced.stderr
    assert assert_same_table(source_conn, dest_conn, schema, "pt") == 5


def test_a_big_batch_with_values_copy_must_escape_arrives_whole(
    cdc_project, schema, writer, source_conn, dest_conn
):
    """A batch of a thousand changes or more is staged many rows at once (cdc/
    copy_block.py), the changes it cannot take one by one: tabs, newlines and backslashes,
    empty strings and NULLs, unchanged TOASTed values and moved keys among plain changes
    all arrive as the source has them."""
    create_orders(writer, schema, rows=1500)
    big = "".join(uuid.uuid4().hex for _ in range(600))  # stored out of line
    on_table(writer, schema, "UPDATE {t} SET big = %s || id WHERE id <= 20", big)
    configure_cdc(cdc_project, schema, "orders")
    cdc_project.sync()
    with writer.transaction():
        on_table(
            writer,
            schema,
            "UPDATE {t} SET amount = amount + 1, note = CASE id % 6 WHEN 0 THEN E'a\\tb' "
            "WHEN 1 THEN '' WHEN 2 THEN NULL WHEN 3 THEN E'c\\\\d\\ne\\r' "
            "WHEN 4 THEN E'\\\\N' ELSE note || '!' END WHERE id <= 1200",
        )
        on_table(writer, schema, "DELETE FROM {t} WHERE id > 1400")
        on_table(
            writer,
            schema,
            "INSERT INTO {t} SELECT g, 'new', g, NULL FROM generate_series(2000, 2300) g",
        )
        on_table(writer, schema, "UPDATE {t} SET id = id + 10000 WHERE id BETWEEN 1 AND 5")
    second = cdc_project.sync()
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
    create_orders(writer, schema, "orders", rows=20)
    create_orders(writer, schema, "items", rows=20)
    big = "".join(uuid.uuid4().hex for _ in range(600))  # stored out of line
    on_table(writer, schema, "UPDATE {t} SET big = %s || id WHERE id <= 3", big)
    configure_cdc(cdc_project, schema, "orders", "items")
    cdc_project.sync()
    for n in range(1, 11):
        with writer.transaction():  # one transaction across both tables
            on_table(writer, schema, "UPDATE {t} SET amount = %s WHERE id = %s", n, n)
            on_table(
                writer, schema, "UPDATE {t} SET note = %s WHERE id = %s", f"i{n}", n, table="items"
            )
    for n in range(1, 4):  # a TOASTed row moved to a new key, then touched, one per batch
        on_table(writer, schema, "UPDATE {t} SET id = id + 100 WHERE id = %s", n)
        on_table(writer, schema, "UPDATE {t} SET note = 'moved' WHERE id = %s", n + 100)
    on_table(writer, schema, "DELETE FROM {t} WHERE id = 15", table="items")
    on_table(writer, schema, "INSERT INTO {t} VALUES (15, 'back', 1, NULL)", table="items")
    synced = cdc_project.sync("-v")
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
    create_orders(writer, schema, "orders", rows=20)
    create_orders(writer, schema, "items", rows=20)
    create_orders(writer, schema, "extra", rows=5)  # its first change comes in a late part
    big = "".join(uuid.uuid4().hex for _ in range(600))  # stored out of line
    on_table(writer, schema, "UPDATE {t} SET big = %s || id WHERE id <= 3", big)
    configure_cdc(cdc_project, schema, "orders", "items", "extra")
    cdc_project.sync()
    with writer.transaction():
        for n in range(1, 11):
            on_table(writer, schema, "UPDATE {t} SET amount = %s WHERE id = %s", n, n)
            on_table(
                writer, schema, "UPDATE {t} SET note = %s WHERE id = %s", f"i{n}", n, table="items"
            )
        for n in range(1, 4):  # a TOASTed row moved to a new key, then touched
            on_table(writer, schema, "UPDATE {t} SET id = id + 100 WHERE id = %s", n)
            on_table(writer, schema, "UPDATE {t} SET note = 'moved' WHERE id = %s", n + 100)
        on_table(writer, schema, "DELETE FROM {t} WHERE id = 15", table="items")
        on_table(writer, schema, "INSERT INTO {t} VALUES (15, 'back', 1, NULL)", table="items")
        on_table(writer, schema, "TRUNCATE {t}", table="items")
        on_table(writer, schema, "INSERT INTO {t} VALUES (7, 'after', 2, NULL)", table="items")
        on_table(
            writer, schema, "INSERT INTO {t} SELECT g, 'x', g, NULL FROM generate_series(40, 60) g"
        )
        on_table(writer, schema, "UPDATE {t} SET note = 'late' WHERE id = 1", table="extra")
    synced = cdc_project.sync("-vv")
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
    on_table(writer, schema, "UPDATE {t} SET note = 'later' WHERE id = 101")  # and it goes on
    cdc_project.sync()
    assert_same_table(source_conn, dest_conn, schema, "orders")


def test_a_transaction_across_two_tables_and_a_copied_project(
    cdc_project, schema, writer, source_conn, dest_conn, tmp_path
):
    create_orders(writer, schema, "orders")
    create_orders(writer, schema, "items")
    configure_cdc(cdc_project, schema, "orders", "items")
    cdc_project.sync()
    with writer.transaction():
        on_table(writer, schema, "UPDATE {t} SET amount = amount + 1 WHERE id < 5", table="orders")
        on_table(writer, schema, "DELETE FROM {t} WHERE id < 5", table="items")
    cdc_project.sync()
    assert_same_table(source_conn, dest_conn, schema, "orders")
    assert assert_same_table(source_conn, dest_conn, schema, "items") == 96

    # The project folder copied elsewhere continues from the same slot.
    import shutil

    copy = tmp_path / "copy"
    shutil.copytree(cdc_project.path, copy)
    slot = json.loads((copy / "sync-state" / "cdc.json").read_text())["slot"]
    confirmed = "SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = %s"
    (before,) = source_conn.execute(confirmed, (slot,)).fetchone()
    on_table(
        writer, schema, "INSERT INTO {t} VALUES (777, 'seen by the copy', 1, NULL)", table="items"
    )
    result = cdc_project.run.__func__(type(cdc_project)(copy, cdc_project.env), "sync")
    assert result.exit_code == 0, result.output
    assert "items: incremental" in result.stderr
    assert assert_same_table(source_conn, dest_conn, schema, "items") == 97
    # the copy read the project's own slot (other tests' slots on this source do not count)
    assert json.loads((copy / "sync-state" / "cdc.json").read_text())["slot"] == slot
    moved = "SELECT confirmed_flush_lsn > %s::pg_lsn FROM pg_replication_slots WHERE slot_name = %s"
    assert source_conn.execute(moved, (before, slot)).fetchone() == (True,)


def test_hostile_identifiers(cdc_project, schema, writer, source_conn, dest_conn):
    table = 'Order "Lines" 😀'
    target = sql.Identifier(schema, table)
    writer.execute(
        sql.SQL('CREATE TABLE {} ("Id %s" int PRIMARY KEY, "Note, ""x""" text)').format(target)
    )
    writer.execute(sql.SQL("INSERT INTO {} VALUES (1, 'a\tb\\c\nd'), (2, NULL)").format(target))
    name = f'{schema}."Order ""Lines"" 😀"'
    cdc_project.write_config({"tables": [{"name": name, "mode": "cdc"}]})
    cdc_project.sync()
    writer.execute(
        sql.SQL('UPDATE {} SET "Note, ""x""" = E\'\\\\N\' WHERE "Id %s" = 2').format(target)
    )
    writer.execute(sql.SQL("INSERT INTO {} VALUES (3, '')").format(target))
    writer.execute(sql.SQL('DELETE FROM {} WHERE "Id %s" = 1').format(target))
    assert ": incremental, 3 rows" in cdc_project.sync().stderr
    assert assert_same_table(source_conn, dest_conn, schema, table, key="Id %s") == 2


def test_json_columns_take_updates(cdc_project, schema, writer, source_conn, dest_conn):
    target = sql.Identifier(schema, "docs")
    writer.execute(
        sql.SQL("CREATE TABLE {} (id int PRIMARY KEY, body json, at point)").format(target)
    )
    writer.execute(sql.SQL("""INSERT INTO {} VALUES (1, '{{"a": 1}}', '(1,2)')""").format(target))
    cdc_project.write_config({"tables": [{"name": f"{schema}.docs", "mode": "cdc"}]})
    cdc_project.sync()
    writer.execute(sql.SQL("""UPDATE {} SET body = '{{"a":  2}}', at = '(3,4)'""").format(target))
    cdc_project.sync()
    assert assert_same_table(source_conn, dest_conn, schema, "docs") == 1


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
    cdc_project.sync()
    (document,) = json.loads(cdc_project.run("compile", "--json").stdout)
    (update,) = [s["sql"] for s in document["script"]["cdc_apply"] if s["sql"].startswith("UPDATE")]
    assert '"d"."tag"::character varying(20)' in update, update
    writer.execute(sql.SQL("DELETE FROM {} WHERE id <= 3").format(target))  # the log: key only
    writer.execute(sql.SQL("UPDATE {} SET tag = 'changed' WHERE id = 4").format(target))
    synced = cdc_project.sync("-v")
    assert assert_same_table(source_conn, dest_conn, schema, "tagged") == 7
    assert update.replace('"replicator_last"', '"replicator_stage_0"') in synced.stderr


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
    loaded = cdc_project.sync()
    assert "the model returned 1 row(s) whose primary key another row also has" in loaded.stderr
    writer.execute(sql.SQL("INSERT INTO {} VALUES (3, 'c')").format(target))
    quiet = cdc_project.sync()
    assert "another row also has" not in quiet.stderr
    writer.execute(
        sql.SQL("INSERT INTO {} VALUES (1, 'again'), (3, 'c2'), (4, 'd')").format(target)
    )
    with writer.transaction():  # twice in one batch, and a row moved onto a taken key
        writer.execute(sql.SQL("INSERT INTO {} VALUES (5, 'e'), (5, 'e2')").format(target))
        writer.execute(sql.SQL("UPDATE {} SET code = 4 WHERE note = 'a'").format(target))
    said = cdc_project.sync()
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
    configure_cdc(cdc_project, schema, "typed")
    cdc_project.sync()
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
        on_table(writer, schema, "UPDATE {t} SET f = f * 3, d = d + 1 WHERE id = 1", table="typed")
        cdc_project.sync()
    finally:
        source_conn.execute(sql.SQL("ALTER ROLE {} RESET ALL").format(role_id))
    assert assert_same_table(source_conn, dest_conn, schema, "typed") == 2


def test_a_transaction_committed_after_the_reading_point_is_the_next_runs(
    cdc_project, schema, writer, pg_servers, source_conn, dest_conn, monkeypatch
):
    """A transaction open when the run begins and committed before its stream starts: the
    stream stops at its Begin (cut, not read to its end), the slot is free when the run
    returns, and the next run applies it once."""
    import psycopg

    from replicator.cdc import drain

    create_orders(writer, schema)
    configure_cdc(cdc_project, schema, "orders")
    cdc_project.sync()
    late = psycopg.connect(pg_servers.source_url)
    late.execute("SET synchronous_commit = on")
    on_table(
        late, schema, "INSERT INTO {t} SELECT g, 'late', g, NULL FROM generate_series(101, 20100) g"
    )
    on_table(writer, schema, "UPDATE {t} SET note = 'before' WHERE id = 1")
    (read_from,) = source_conn.execute("SELECT pg_current_wal_flush_lsn()").fetchone()
    start = drain.LogStream.start

    def start_after_the_commit(stream, position):
        late.commit()  # after the run's reading point, flushed before the stream decodes
        return start(stream, position)

    monkeypatch.setattr(drain.LogStream, "start", start_after_the_commit)
    try:
        cdc_project.sync()
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
        (read_from, slot_of(cdc_project)),
    ).fetchone() == (None, True)
    monkeypatch.undo()
    cdc_project.sync()
    assert assert_same_table(source_conn, dest_conn, schema, "orders") == 20_100


def test_a_batch_applied_in_parts_closes_at_its_transaction_s_commit(
    cdc_project, schema, writer, source_conn, dest_conn
):
    """A transaction bigger than the drain's first batch (12,500 changes) is applied in
    parts, in a destination transaction that stays open until the batch ends: the batch
    ends at that transaction's commit, not with the transactions after it."""
    create_orders(writer, schema, "orders", rows=10)
    configure_cdc(cdc_project, schema, "orders")
    cdc_project.sync()
    on_table(
        writer, schema, "INSERT INTO {t} SELECT g, 'big', g, NULL FROM generate_series(11, 20010) g"
    )
    for n in range(10):
        on_table(writer, schema, "UPDATE {t} SET amount = %s WHERE id %% 10 = %s", n, n)
    synced = cdc_project.sync("-vv")
    assert "cdc: part of a batch" in synced.stderr
    assert "cdc: batch of 20000 change(s)" in synced.stderr, synced.stderr[-3000:]
    assert assert_same_table(source_conn, dest_conn, schema, "orders") == 20_010


def test_a_row_the_where_filter_lets_in_without_its_toasted_value_reloads_the_copy(
    cdc_project, schema, writer, source_conn, dest_conn
):
    """An update that moves a row into the publication's row filter arrives as an insert
    that leaves its unchanged TOASTed value out (replica identity DEFAULT): the copy took the
    value of the key's deleted row and the sync exited 0. Now the table fails with why, and
    its next sync reloads it."""
    create_orders(writer, schema, rows=20)
    on_table(writer, schema, "INSERT INTO {t} VALUES (150, 'outside', 1, NULL)")
    on_table(writer, schema, "UPDATE {t} SET big = md5(id::text) || %s", big_text())
    table = {"name": f"{schema}.orders", "mode": "cdc", "where": "id < 100"}
    cdc_project.write_config({"tables": [table]})
    cdc_project.sync()
    with writer.transaction():
        on_table(writer, schema, "DELETE FROM {t} WHERE id = 5")
        on_table(writer, schema, "UPDATE {t} SET id = 5, note = 'in' WHERE id = 150")
    failed = cdc_project.run("sync")
    assert failed.exit_code == 1, failed.output
    assert "a row the table's row filter (`where`) let in by an update came without" in (
        failed.stderr
    )
    cdc_project.sync()
    copied = _filtered_rows(dest_conn, schema, "true")
    assert copied == _filtered_rows(source_conn, schema, "id < 100") and len(copied) == 20


def test_a_key_move_before_a_truncate_in_the_batch_needs_no_toasted_value(
    cdc_project, schema, writer, source_conn, dest_conn
):
    """A move that kept a TOASTed value, then a TRUNCATE of the table, in one batch: the
    move was resolved against the emptied copy and failed the table (exit 1, a reload)."""
    create_orders(writer, schema, rows=5)
    on_table(writer, schema, "UPDATE {t} SET big = md5(id::text) || %s", big_text())
    configure_cdc(cdc_project, schema, "orders")
    cdc_project.sync()
    on_table(writer, schema, "UPDATE {t} SET id = 100 WHERE id = 1")
    on_table(writer, schema, "TRUNCATE {t}")
    on_table(writer, schema, "INSERT INTO {t} VALUES (7, 'after', 1, NULL)")
    said = cdc_project.sync()
    assert "reload" not in said.stderr, said.stderr
    assert assert_same_table(source_conn, dest_conn, schema, "orders") == 1
