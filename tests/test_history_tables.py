"""`tables[].history`: every version of each row beside the copy (postgres/history_tables.py,
cdc/apply/history_apply.py), exact to the commit for a `cdc` table, never rewriting the past."""

from __future__ import annotations

import json
import re
import threading
from pathlib import Path

import psycopg
import pytest
from cdc_tables import create_orders, on_table
from dbcompare import assert_same_table
from engines import IN_PROCESS
from psycopg import sql

pytestmark = pytest.mark.spark


def _versions(dest_conn, schema, table="orders_history"):
    return dest_conn.execute(
        sql.SQL(
            "SELECT id, note, _valid_from, _valid_to, _is_current, _op FROM {} "
            "ORDER BY id, _valid_from"
        ).format(sql.Identifier(schema, table))
    ).fetchall()


def _current_equals_copy(dest_conn, schema):
    """The history's current versions are the copy's rows (every column), one per key."""
    columns = sql.SQL(", ").join(
        sql.Identifier(name)
        for (name,) in dest_conn.execute(
            "SELECT attname FROM pg_attribute WHERE attrelid = %s::regclass AND attnum > 0 "
            "AND NOT attisdropped ORDER BY attnum",
            (f'"{schema}"."orders"',),
        )
    )
    names = {"c": sql.Identifier(schema, "orders"), "h": sql.Identifier(schema, "orders_history")}
    missing = dest_conn.execute(
        sql.SQL(
            "SELECT count(*) FROM (SELECT {cols} FROM {c} EXCEPT ALL "
            "SELECT {cols} FROM {h} WHERE _is_current) x"
        ).format(cols=columns, **names)
    ).fetchone()[0]
    extra = dest_conn.execute(
        sql.SQL(
            "SELECT count(*) FROM (SELECT {cols} FROM {h} WHERE _is_current "
            "EXCEPT ALL SELECT {cols} FROM {c}) x"
        ).format(cols=columns, **names)
    ).fetchone()[0]
    assert (missing, extra) == (0, 0)


def _no_overlaps(dest_conn, schema):
    """Each key's versions follow one another: none overlaps the next, one at most current,
    and `_is_current` says what `_valid_to` does."""
    bad = dest_conn.execute(
        sql.SQL(
            "SELECT count(*) FROM (SELECT _valid_from, _valid_to, _is_current, lead(_valid_from) "
            "OVER (PARTITION BY id ORDER BY _valid_from) AS next FROM {}) v "
            "WHERE (_valid_to IS NULL) <> _is_current OR _valid_to < _valid_from "
            "OR (next IS NOT NULL AND (_valid_to IS NULL OR _valid_to > next))"
        ).format(sql.Identifier(schema, "orders_history"))
    ).fetchone()[0]
    assert bad == 0


def test_a_cursor_table_s_loads_write_snapshot_versions_and_a_reload_keeps_the_past(
    db_project, schema, source_conn, dest_conn
):
    create_orders(source_conn, schema, rows=20)
    db_project.configure(schema, "orders", mode="full-refresh", history=True)
    db_project.sync()
    first = _versions(dest_conn, schema)
    assert len(first) == 20
    assert {row[5] for row in first} == {"snapshot"}
    assert all(row[3] is None and row[4] for row in first)
    _current_equals_copy(dest_conn, schema)

    on_table(source_conn, schema, "UPDATE {t} SET note = 'changed' WHERE id <= 3")
    on_table(source_conn, schema, "DELETE FROM {t} WHERE id = 20")
    on_table(source_conn, schema, "INSERT INTO {t} VALUES (21, 'new', 1, NULL)")
    db_project.sync()
    after = _versions(dest_conn, schema)
    assert len(after) == 20 + 3 + 1  # three changed rows' new versions, one new row
    untouched = [r for r in after if 4 <= r[0] <= 19]
    assert untouched == [r for r in first if 4 <= r[0] <= 19]  # the past stays as it was
    gone = [r for r in after if r[0] == 20]
    assert len(gone) == 1 and gone[0][3] is not None and not gone[0][4]
    changed = [r for r in after if r[0] == 1]
    assert [r[1] for r in changed] == ["n1", "changed"]
    assert changed[0][3] == changed[1][2]  # the old version ends where the new one begins
    _current_equals_copy(dest_conn, schema)
    _no_overlaps(dest_conn, schema)

    db_project.sync()  # nothing changed: nothing written
    assert _versions(dest_conn, schema) == after
    assert_same_table(source_conn, dest_conn, schema, "orders")


def _committed(writer, schema, *statements):
    """Run the statements in one source transaction; its commit time, as the source kept it."""
    with writer.transaction():
        for statement in statements:
            on_table(writer, schema, statement)
        (xid,) = writer.execute("SELECT pg_current_xact_id()::text::xid").fetchone()
    (at,) = writer.execute("SELECT pg_xact_commit_timestamp(%s::xid)", (str(xid),)).fetchone()
    assert at is not None, "the source must run with track_commit_timestamp = on"
    return at


def test_a_cdc_table_s_history_has_a_version_per_transaction_at_its_commit_time(
    cdc_project, schema, writer, source_conn, dest_conn
):
    create_orders(writer, schema, rows=10)
    cdc_project.configure(schema, "orders", mode="cdc", history=True)
    cdc_project.sync()
    loaded = _versions(dest_conn, schema)
    assert len(loaded) == 10 and {r[5] for r in loaded} == {"snapshot"}
    snapshot_at = loaded[0][2]

    inserted = _committed(writer, schema, "INSERT INTO {t} VALUES (11, 'new', 1, NULL)")
    updated = _committed(  # many updates of one row in one transaction: one version
        writer,
        schema,
        "UPDATE {t} SET note = 'a' WHERE id = 1",
        "UPDATE {t} SET note = 'b' WHERE id = 1",
        "UPDATE {t} SET note = 'c' WHERE id = 1",
    )
    deleted = _committed(writer, schema, "DELETE FROM {t} WHERE id = 2")
    back = _committed(writer, schema, "INSERT INTO {t} VALUES (2, 'back', 2, NULL)")
    born_and_gone = _committed(  # a key inserted and deleted in one transaction: no version
        writer,
        schema,
        "INSERT INTO {t} VALUES (12, 'brief', 1, NULL)",
        "DELETE FROM {t} WHERE id = 12",
    )
    assert born_and_gone
    cdc_project.sync()
    versions = {(r[0], r[2]): r for r in _versions(dest_conn, schema)}
    assert versions[(11, inserted)][1:] == ("new", inserted, None, True, "insert")
    assert versions[(1, updated)][1:] == ("c", updated, None, True, "update")
    assert versions[(1, snapshot_at)][3] == updated  # the snapshot's version ends there
    assert versions[(2, snapshot_at)][3:5] == (deleted, False)  # closed by the delete
    assert versions[(2, back)][1:] == ("back", back, None, True, "insert")
    assert not [k for k in versions if k[0] == 12]
    assert snapshot_at < inserted
    _current_equals_copy(dest_conn, schema)
    _no_overlaps(dest_conn, schema)

    truncated = _committed(writer, schema, "TRUNCATE {t}")
    after = _committed(writer, schema, "INSERT INTO {t} VALUES (1, 'after', 1, NULL)")
    cdc_project.sync()
    rows = _versions(dest_conn, schema)
    current = [r for r in rows if r[4]]
    assert [(r[0], r[1], r[2]) for r in current] == [(1, "after", after)]
    assert {r[3] for r in rows if r[2] < truncated and r[3] is not None and r[3] >= truncated} == {
        truncated
    }  # every version open at the TRUNCATE ends at its commit
    _current_equals_copy(dest_conn, schema)
    _no_overlaps(dest_conn, schema)
    assert_same_table(source_conn, dest_conn, schema, "orders")


def _create_events(conn, schema):
    conn.execute(
        sql.SQL(
            "CREATE TABLE {} (id int PRIMARY KEY, note text, amount numeric, big text, "
            "updated_at timestamptz NOT NULL)"
        ).format(sql.Identifier(schema, "orders"))
    )
    on_table(
        conn,
        schema,
        "INSERT INTO {t} SELECT g, 'n' || g, g, NULL, now() - interval '1 day' "
        "FROM generate_series(1, 10) g",
    )


def test_a_cursor_table_s_versions_begin_at_their_replication_key_and_replays_add_none(
    db_project, schema, source_conn, dest_conn
):
    _create_events(source_conn, schema)
    db_project.configure(
        schema, "orders", replication_key="updated_at", history=True, deletes="delete"
    )
    db_project.sync()
    on_table(source_conn, schema, "UPDATE {t} SET note = 'x', updated_at = now() WHERE id = 1")
    on_table(source_conn, schema, "INSERT INTO {t} VALUES (11, 'new', 1, NULL, now())")
    on_table(source_conn, schema, "DELETE FROM {t} WHERE id = 2")
    result = db_project.sync("--log-format", "json")
    assert "history: 2 version(s) added, 2 closed" in result.stderr or '"versions_added": 2' in (
        result.stderr
    ), result.stderr
    rows = _versions(dest_conn, schema)
    (updated_at,) = source_conn.execute(
        sql.SQL("SELECT updated_at FROM {} WHERE id = 1").format(sql.Identifier(schema, "orders"))
    ).fetchone()
    one = [r for r in rows if r[0] == 1]
    assert [(r[1], r[5]) for r in one] == [("n1", "snapshot"), ("x", "update")]
    assert one[1][2] == updated_at and one[0][3] == updated_at
    assert [r[5] for r in rows if r[0] == 11] == ["insert"]
    gone = [r for r in rows if r[0] == 2]
    assert len(gone) == 1 and not gone[0][4]  # the delete check closed it
    _no_overlaps(dest_conn, schema)

    db_project.sync()  # the lookback reads the last rows again: nothing changed, none added
    assert _versions(dest_conn, schema) == rows
    assert_same_table(source_conn, dest_conn, schema, "orders")


def _expected_versions(writer, schema, touched):
    """Per key, the commit times of the transactions whose last change of it was not a
    delete, as `touched` recorded them: [(xid, {key: deleted?})]."""
    expected: dict[int, list] = {}
    for xid, keys in touched:
        (at,) = writer.execute("SELECT pg_xact_commit_timestamp(%s::xid)", (xid,)).fetchone()
        for key, deleted in keys.items():
            if not deleted:
                expected.setdefault(key, []).append(at)
    return expected


def _log_versions(dest_conn, schema):
    found: dict[int, list] = {}
    for key, at in dest_conn.execute(
        sql.SQL(
            "SELECT id, _valid_from FROM {} WHERE _op <> 'snapshot' ORDER BY id, _valid_from"
        ).format(sql.Identifier(schema, "orders_history"))
    ):
        found.setdefault(key, []).append(at)
    return found


def _transactions(writer, schema, start, count, touched):
    """`count` transactions, each inserting one key, updating two and deleting one."""
    for n in range(start, start + count):
        with writer.transaction():
            on_table(writer, schema, f"INSERT INTO {{t}} VALUES ({1000 + n}, 'i{n}', {n}, NULL)")
            on_table(
                writer, schema, f"UPDATE {{t}} SET note = 'u{n}' WHERE id IN ({n % 50 + 1}, 7)"
            )
            on_table(writer, schema, f"DELETE FROM {{t}} WHERE id = {1000 + n - 3}")
            (xid,) = writer.execute("SELECT pg_current_xact_id()::text").fetchone()
        keys = {1000 + n: False, n % 50 + 1: False, 7: False}
        if n - 3 >= 0:
            keys[1000 + n - 3] = True
        touched.append((xid, keys))


@pytest.mark.parametrize("point", ["cdc-after-stage", "cdc-before-apply-commit", "cdc-after-part"])
def test_a_drain_killed_anywhere_writes_each_version_once(
    cdc_project, schema, writer, source_conn, dest_conn, point
):
    create_orders(writer, schema, rows=50)
    cdc_project.configure(schema, "orders", mode="cdc", history=True)
    assert cdc_project.run("sync", env=IN_PROCESS).exit_code == 0
    touched: list = []
    _transactions(writer, schema, 0, 40, touched)
    with writer.transaction():  # bigger than a drain's first batch: applied in parts
        on_table(
            writer,
            schema,
            "INSERT INTO {t} SELECT g, 'big', 1, NULL FROM generate_series(100001, 120000) g",
        )
        on_table(writer, schema, "UPDATE {t} SET note = 'big again' WHERE id > 110000")
        (xid,) = writer.execute("SELECT pg_current_xact_id()::text").fetchone()
    touched.append((xid, dict.fromkeys(range(100001, 120001), False)))
    _transactions(writer, schema, 40, 20, touched)
    killed = cdc_project.run_process("sync", env={**IN_PROCESS, "REPLICATOR_FAILPOINT": point})
    assert killed.returncode == -9, killed.stderr[-2000:]
    _transactions(writer, schema, 60, 10, touched)
    done = cdc_project.run("sync", env=IN_PROCESS)
    assert done.exit_code == 0, done.output[-3000:]
    assert _log_versions(dest_conn, schema) == _expected_versions(writer, schema, touched)
    _current_equals_copy(dest_conn, schema)
    _no_overlaps(dest_conn, schema)
    assert_same_table(source_conn, dest_conn, schema, "orders")


def test_verify_finds_a_damaged_history_and_repair_closes_and_opens_versions(
    cdc_project, schema, writer, source_conn, dest_conn
):
    create_orders(writer, schema, rows=20)
    cdc_project.configure(schema, "orders", mode="cdc", history=True)
    cdc_project.sync()
    on_table(writer, schema, "UPDATE {t} SET note = 'u' WHERE id <= 5")
    cdc_project.sync()
    clean = cdc_project.run("verify", "--json", env=IN_PROCESS)
    assert clean.exit_code == 0, clean.output
    assert json.loads(clean.stdout)[0]["history"]["status"] == "equal"

    history = sql.Identifier(schema, "orders_history")
    dest_conn.execute(  # a current version lost, one changed, one reopened, one gone
        sql.SQL("DELETE FROM {} WHERE id = 10").format(history)
    )
    dest_conn.execute(
        sql.SQL("UPDATE {} SET note = 'tampered' WHERE id = 11 AND _is_current").format(history)
    )
    dest_conn.execute(
        sql.SQL(
            "UPDATE {} SET _valid_to = NULL, _is_current = true WHERE id = 1 AND _op = 'snapshot'"
        ).format(history)
    )
    dest_conn.execute(
        sql.SQL(
            "INSERT INTO {} (id, note, _valid_from, _op) VALUES (999, 'x', now(), 'insert')"
        ).format(history)
    )
    (before,) = dest_conn.execute(sql.SQL("SELECT count(*) FROM {}").format(history)).fetchone()
    found = cdc_project.run("verify", "--json", env=IN_PROCESS)
    assert found.exit_code == 1
    checked = json.loads(found.stdout)[0]
    assert checked["status"] == "different" and checked["different"] == 0  # the copy is exact
    assert {k: checked["history"][k] for k in ("missing", "extra", "different")} == {
        "missing": 1,  # key 10
        "extra": 1,  # key 999
        "different": 2,  # key 11, and key 1's old version made current again
    }
    assert checked["history"]["two_current"] == 1 and checked["history"]["overlapping"] >= 1

    repaired = cdc_project.run("verify", "--repair", "--json", env=IN_PROCESS)
    assert repaired.exit_code == 0, repaired.output
    assert json.loads(repaired.stdout)[0]["history"]["repaired"] > 0
    (after,) = dest_conn.execute(sql.SQL("SELECT count(*) FROM {}").format(history)).fetchone()
    assert after >= before  # the past is closed, never deleted
    again = cdc_project.run("verify", "--json", env=IN_PROCESS)
    assert again.exit_code == 0, again.output
    assert json.loads(again.stdout)[0]["history"]["status"] == "equal"
    _current_equals_copy(dest_conn, schema)
    _no_overlaps(dest_conn, schema)


@pytest.mark.parametrize("mode", ["cdc", "incremental-deduped"])
def test_a_column_added_in_place_is_added_to_the_history_and_its_current_versions(
    cdc_project, schema, writer, source_conn, dest_conn, mode
):
    _create_events(writer, schema)
    keys = {"replication_key": "updated_at"} if mode != "cdc" else {}
    cdc_project.configure(
        schema, "orders", mode=mode, history=True, on_schema_change="evolve", **keys
    )
    assert cdc_project.run("sync", env=IN_PROCESS).exit_code == 0
    on_table(writer, schema, "UPDATE {t} SET note = 'before', updated_at = now() WHERE id = 1")
    assert cdc_project.run("sync", env=IN_PROCESS).exit_code == 0
    on_table(writer, schema, "ALTER TABLE {t} ADD COLUMN region text DEFAULT 'eu'")
    on_table(
        writer,
        schema,
        "UPDATE {t} SET region = 'us', note = 'after', updated_at = now() WHERE id = 2",
    )
    evolved = cdc_project.run("sync", env=IN_PROCESS)
    assert evolved.exit_code == 0, evolved.output
    assert "schema evolved: column added: region" in evolved.stderr, evolved.stderr
    history = sql.Identifier(schema, "orders_history")
    rows = dest_conn.execute(
        sql.SQL("SELECT id, note, region, _is_current FROM {} ORDER BY id, _valid_from").format(
            history
        )
    ).fetchall()
    current = {r[0]: r[2] for r in rows if r[3]}
    assert current[2] == "us" and {current[k] for k in current if k != 2} == {"eu"}
    assert [r[2] for r in rows if r[0] == 1 and not r[3]] == [None]  # the past had no region
    assert [r[1] for r in rows if r[0] == 2] == ["n2", "after"]
    _current_equals_copy(dest_conn, schema)
    _no_overlaps(dest_conn, schema)
    assert_same_table(source_conn, dest_conn, schema, "orders")


def _guide_queries():
    """The three SQL blocks of docs/guides/history.md's Queries section."""
    guide = (Path(__file__).resolve().parents[1] / "docs/guides/history.md").read_text()
    section = guide.split("## Queries", 1)[1].split("\n## ", 1)[0]
    return [q.strip().rstrip(";") for q in re.findall(r"```sql\n(.*?)```", section, re.S)]


def test_the_guide_s_as_of_range_and_deleted_key_queries_answer_from_the_log_s_history(
    cdc_project, schema, writer, dest_conn
):
    orders = sql.Identifier(schema, "orders")
    writer.execute(
        sql.SQL("CREATE TABLE {} (id int PRIMARY KEY, status text, amount numeric)").format(orders)
    )
    writer.execute(
        sql.SQL("INSERT INTO {} VALUES (1, 'open', 1), (2, 'open', 2), (3, 'closed', 3)").format(
            orders
        )
    )
    cdc_project.configure(schema, "orders", mode="cdc", history=True)
    cdc_project.sync()
    _committed(writer, schema, "UPDATE {t} SET status = 'closed' WHERE id = 1")
    (middle,) = writer.execute("SELECT clock_timestamp()").fetchone()
    deleted = _committed(writer, schema, "DELETE FROM {t} WHERE id = 2")
    _committed(writer, schema, "UPDATE {t} SET status = 'open' WHERE id = 3")
    (end,) = writer.execute("SELECT clock_timestamp()").fetchone()
    cdc_project.sync()
    as_of, during, gone = (q.replace("public.", f'"{schema}".') for q in _guide_queries())
    as_of = as_of.replace("'2026-03-03 00:00+00'", "%(t)s")
    during = during.replace("'2026-11-01 00:00+00'", "%(a)s").replace(
        "'2026-12-01 00:00+00'", "%(b)s"
    )
    rows = dest_conn.execute(as_of + " ORDER BY id", {"t": middle}).fetchall()
    assert [(r[0], r[1]) for r in rows] == [(1, "closed"), (2, "open"), (3, "closed")]
    ids = dest_conn.execute(during, {"a": middle, "b": end}).fetchall()
    assert sorted(r[0] for r in ids) == [2, 3]
    assert dest_conn.execute(gone).fetchall() == [(2, "open", deleted)]


def test_a_reload_beside_writers_keeps_the_past_and_the_log_goes_on_from_its_snapshot(
    cdc_project, schema, writer, pg_servers, source_conn, dest_conn
):
    create_orders(writer, schema, rows=3000)
    cdc_project.configure(schema, "orders", mode="cdc", history=True)
    assert cdc_project.run("sync", env=IN_PROCESS).exit_code == 0
    on_table(writer, schema, "UPDATE {t} SET note = 'first' WHERE id <= 100")
    assert cdc_project.run("sync", env=IN_PROCESS).exit_code == 0
    history = sql.Identifier(schema, "orders_history")
    past = sql.SQL(
        "SELECT id, note, _valid_from, _valid_to FROM {} WHERE NOT _is_current ORDER BY 1, 3"
    ).format(history)
    closed_before = dest_conn.execute(past).fetchall()
    assert len(closed_before) == 100

    stop = threading.Event()

    def write() -> None:
        with psycopg.connect(pg_servers.source_url, autocommit=True) as conn:
            conn.execute("SET synchronous_commit = on")
            n = 0
            while not stop.is_set():
                n += 1
                on_table(
                    conn, schema, "UPDATE {t} SET note = %s WHERE id = %s", f"w{n}", n % 3000 + 1
                )

    thread = threading.Thread(target=write)
    thread.start()
    try:
        reloaded = cdc_project.run("sync", "-f", env=IN_PROCESS)
        assert reloaded.exit_code == 0, reloaded.output
        after = cdc_project.run("sync", env=IN_PROCESS)
        assert after.exit_code == 0, after.output
    finally:
        stop.set()
        thread.join()
    assert cdc_project.run("sync", env=IN_PROCESS).exit_code == 0
    closed_after = dest_conn.execute(past).fetchall()
    assert set(closed_before) <= set(closed_after)  # the reload closed more, rewrote none
    _current_equals_copy(dest_conn, schema)
    _no_overlaps(dest_conn, schema)
    assert_same_table(source_conn, dest_conn, schema, "orders")


def test_a_history_table_dropped_by_hand_reloads_the_copy_and_begins_again(
    db_project, schema, source_conn, dest_conn
):
    _create_events(source_conn, schema)
    db_project.configure(schema, "orders", replication_key="updated_at", history=True)
    db_project.sync()
    dest_conn.execute(sql.SQL("DROP TABLE {}").format(sql.Identifier(schema, "orders_history")))
    again = db_project.sync()
    assert "history table" in again.stderr and "missing" in again.stderr, again.stderr
    assert "full_reload" in again.stderr
    assert {r[5] for r in _versions(dest_conn, schema)} == {"snapshot"}
    _current_equals_copy(dest_conn, schema)


def test_compile_prints_the_statements_that_write_the_versions(
    db_project, schema, source_conn, dest_conn
):
    _create_events(source_conn, schema)
    db_project.configure(schema, "orders", replication_key="updated_at", history=True)
    before = db_project.run("compile")
    assert before.exit_code == 0, before.output
    history = f'"{schema}"."orders_history"'
    # the first load: the history table made, and a snapshot version of every row
    assert f"CREATE TABLE IF NOT EXISTS {history}" in before.stdout
    assert f"INSERT INTO {history}" in before.stdout and "'snapshot'" in before.stdout
    db_project.sync()
    after = db_project.run("compile")
    assert after.exit_code == 0, after.output
    batch = after.stdout.split("-- incremental:", 1)[1]
    assert f'UPDATE {history} AS h SET "_valid_to"' in batch  # a batch closes, then opens
    assert f"INSERT INTO {history}" in batch
    assert "'<snapshot time>'" in batch  # the time sync binds


def test_history_turned_off_and_on_again_reloads_and_keeps_the_past(
    db_project, schema, source_conn, dest_conn
):
    _create_events(source_conn, schema)
    db_project.configure(schema, "orders", replication_key="updated_at", history=True)
    db_project.sync()
    db_project.configure(schema, "orders", replication_key="updated_at")
    on_table(source_conn, schema, "UPDATE {t} SET note = 'unseen', updated_at = now() WHERE id = 1")
    db_project.sync()
    db_project.configure(schema, "orders", replication_key="updated_at", history=True)
    again = db_project.sync()
    assert "not kept by the last sync" in again.stderr and "full_reload" in again.stderr
    one = [r for r in _versions(dest_conn, schema) if r[0] == 1]
    assert [(r[1], r[5]) for r in one] == [("n1", "snapshot"), ("unseen", "snapshot")]
    _current_equals_copy(dest_conn, schema)
    _no_overlaps(dest_conn, schema)
