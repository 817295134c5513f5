"""The project's replication slot never holds WAL it does not need, says when it holds too
much, and a lost slot fails the run with the fix: against real servers."""

from __future__ import annotations

import json
import re
import uuid

import pytest
from cdc_tables import configure_cdc, create_orders, dba_slot, drop_dba_slots, on_table, slot_of
from dbcompare import assert_same_table
from psycopg import sql
from waiting import wait_for

from replicator.cdc.source.slot import SlotInfo
from replicator.cdc.source.slot_health import slot_alarm

pytestmark = pytest.mark.spark

MB = 1 << 20


@pytest.fixture
def other_database(pg_servers, source_conn):
    """A second database in the source cluster: its WAL is in the same log as the slot's."""
    import psycopg

    name = f"other_{uuid.uuid4().hex[:8]}"
    source_conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    url = pg_servers.source_url.rsplit("/", 1)[0] + "/" + name
    try:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("CREATE TABLE busy (v text)")
            yield conn
    finally:
        source_conn.execute(
            sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
        )


def _write_wal(conn, source_conn, megabytes):
    """About `megabytes` of WAL from the other database, then a CHECKPOINT: it writes the
    running-transactions record that the bgwriter writes every 15 s on a busy server, the
    only place a slot's restart point can move to."""
    rows = megabytes * MB // 250
    conn.execute("INSERT INTO busy SELECT repeat('x', 200) FROM generate_series(1, %s)", (rows,))
    source_conn.execute("CHECKPOINT")


def _slot_row(source_conn, project):
    return source_conn.execute(
        "SELECT pg_current_wal_lsn() - restart_lsn, confirmed_flush_lsn, wal_status "
        "FROM pg_replication_slots WHERE slot_name = %s",
        (slot_of(project),),
    ).fetchone()


def _retained(source_conn, project):
    return int(_slot_row(source_conn, project)[0])


def _plain(conn, schema):
    conn.execute(
        sql.SQL("CREATE TABLE {} (id int PRIMARY KEY)").format(sql.Identifier(schema, "plain"))
    )


def _configure(project, schema, **top):
    project.write_config(
        {
            "tables": [
                {"name": f"{schema}.orders", "mode": "cdc"},
                {"name": f"{schema}.plain", "mode": "full-refresh"},
            ],
            **top,
        }
    )


def _unsized(text: str) -> str:
    """A slot warning without its size (`retains 16.9 MB`): WAL the source writes between two
    readings (autovacuum, a checkpoint) changes it."""
    return re.sub(r"retains [\d.,]+ \w+", "retains (size)", text)


def test_the_slot_moves_past_wal_its_tables_do_not_need_and_keeps_what_they_do(
    cdc_project, schema, writer, source_conn, dest_conn, other_database, httpserver
):
    """Another database's WAL is passed whether or not the run selects a cdc table; a
    change a cdc table has not applied holds the slot (nothing lost), and past
    cdc.max_retained_wal every run says so, in the log, the webhook and status."""
    create_orders(writer, schema)
    _plain(writer, schema)
    hook = httpserver.url_for("/hook")
    httpserver.expect_request("/hook", method="POST").respond_with_data("ok")
    _configure(cdc_project, schema, webhook={"url": hook}, cdc={"max_retained_wal": "8MB"})
    cdc_project.sync()

    _write_wal(other_database, source_conn, 32)
    assert _retained(source_conn, cdc_project) > 32 * MB
    for _ in range(2):  # the first moves past the log; the second its restart point too
        cdc_project.sync()
    assert _retained(source_conn, cdc_project) < 2 * MB

    _write_wal(other_database, source_conn, 32)
    for _ in range(2):  # no cdc table selected: the slot moves all the same
        quiet = cdc_project.sync("-s", "plain")
    assert _retained(source_conn, cdc_project) < 2 * MB
    assert "warning" not in quiet.stderr
    assert all(request.get_json()["warnings"] == [] for request, _ in httpserver.log)

    on_table(writer, schema, "UPDATE {t} SET note = 'waits in the slot' WHERE id <= 10")
    (committed,) = writer.execute("SELECT pg_current_wal_lsn()").fetchone()
    _write_wal(other_database, source_conn, 16)
    for _ in range(2):
        held = cdc_project.sync("-s", "plain")
    retained, confirmed, _ = _slot_row(source_conn, cdc_project)
    assert confirmed < committed  # held before the update's commit
    assert retained > 16 * MB
    warning = f"replication slot {slot_of(cdc_project)} retains "
    assert warning in held.stderr and "over cdc.max_retained_wal (8MB)" in held.stderr
    warnings = httpserver.log[-1][0].get_json()["warnings"]
    assert len(warnings) == 1 and warnings[0].startswith(warning), warnings
    # the same warning; its figure is read again, and the source may have written since
    status = json.loads(cdc_project.run("status", "--json").stdout)
    assert _unsized(status[0]["slot_warning"]) == _unsized(warnings[0])
    assert status[1]["slot_warning"] is None  # not a cdc table
    assert f"warning: {_unsized(warnings[0])}" in _unsized(cdc_project.run("status").output)

    applied = cdc_project.sync("-s", "orders")
    assert "orders: incremental, 10 rows" in applied.stderr
    assert_same_table(source_conn, dest_conn, schema, "orders")
    cdc_project.sync()
    assert _retained(source_conn, cdc_project) < 2 * MB


def _lose_the_slot(project, schema, writer, source_conn) -> None:
    """The source removes WAL the project's slot still needs (max_slot_wal_keep_size)."""
    try:
        # 1MB: PostgreSQL 15 counts it in whole WAL segments (16MB), as it removes them.
        source_conn.execute("ALTER SYSTEM SET max_slot_wal_keep_size = '1MB'")
        source_conn.execute("SELECT pg_reload_conf()")

        def lose() -> bool:
            """A new segment and a checkpoint; the checkpointer reads the reloaded setting a
            moment after the reload, so this may take more than one turn."""
            writer.execute("SELECT pg_switch_wal()")
            on_table(writer, schema, "UPDATE {t} SET amount = amount + 1 WHERE id = 1")
            source_conn.execute("CHECKPOINT")
            return _slot_row(source_conn, project)[2] == "lost"

        wait_for(lose, 60, "the slot to be lost")
    finally:
        source_conn.execute("ALTER SYSTEM RESET max_slot_wal_keep_size")
        source_conn.execute("SELECT pg_reload_conf()")


def test_a_lost_dba_slot_is_said_alike_by_status_and_sync(
    cdc_project, schema, writer, source_conn, dest_conn
):
    """A slot a DBA made (`create: false`) that is lost: the tool may not make it again, so
    the sync fails the table at every run until the DBA does, and `status` says exactly
    that (it said the next sync makes a new slot and reloads)."""
    slot = f"dba_{uuid.uuid4().hex[:12]}"
    create_orders(writer, schema)
    dba_slot(source_conn, schema, slot, "orders")
    try:
        configure_cdc(
            cdc_project, schema, "orders", cdc={"slot": slot, "publication": slot, "create": False}
        )
        cdc_project.sync()
        _lose_the_slot(cdc_project, schema, writer, source_conn)
        status = json.loads(cdc_project.run("status", "--json").stdout)
        assert status[0]["next_action"] == f"fail: replication slot {slot} is lost", status
        shown = cdc_project.run("status").output
        said = (
            f"replication slot {slot} (named in tables-config.json `cdc`) is lost (its WAL was "
            f"removed): every sync fails the cdc tables until a DBA does: drop it and create "
            f"it again"
        )
        assert said in shown, shown
        assert "makes a new slot" not in shown
        for _ in range(2):
            synced = cdc_project.run("sync")
            assert synced.exit_code == 1 and said in synced.stderr, synced.stderr
        source_conn.execute("SELECT pg_drop_replication_slot(%s)", (slot,))
        source_conn.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (slot,))
        reloaded = cdc_project.sync()
        assert f"{schema}.orders: full_reload" in reloaded.stderr, reloaded.stderr
        assert_same_table(source_conn, dest_conn, schema, "orders")
    finally:
        drop_dba_slots(source_conn, slot)


def test_a_lost_slot_reloads_every_cdc_table_and_the_run_exits_1(
    cdc_project, schema, writer, source_conn, dest_conn, httpserver
):
    """Never a silent gap: status says the next sync reloads (reason slot lost) and why; the
    sync makes a new slot, reloads every cdc table, syncs the others, says the loss in the
    log and the webhook (status failure, `warnings`) and exits 1; `cdc restart --repair`
    is named as the way to keep the copies next time."""
    create_orders(writer, schema)
    _plain(writer, schema)
    httpserver.expect_request("/hook", method="POST").respond_with_data("ok")
    _configure(cdc_project, schema, webhook={"url": httpserver.url_for("/hook")})
    cdc_project.sync()
    on_table(writer, schema, "UPDATE {t} SET note = 'before the loss'")
    _lose_the_slot(cdc_project, schema, writer, source_conn)
    status = json.loads(cdc_project.run("status", "--json").stdout)
    assert status[0]["next_action"] == "full_reload: slot lost", status  # not incremental
    said = status[0]["slot_warning"]
    assert said.startswith(f"replication slot {slot_of(cdc_project)} is lost"), status
    assert "run `replicator cdc restart --repair` before the next sync" in said

    synced = cdc_project.run("sync")
    assert synced.exit_code == 1, synced.output
    assert said in synced.stderr
    assert f"{schema}.orders: full_reload" in synced.stderr
    assert "reason: slot lost" in synced.stderr
    assert f"{schema}.plain: full_reload" in synced.stderr  # the other tables sync too
    notice = httpserver.log[-1][0].get_json()
    assert notice["status"] == "failure" and said in notice["warnings"], notice
    assert _slot_row(source_conn, cdc_project)[2] != "lost"  # a new slot
    assert_same_table(source_conn, dest_conn, schema, "orders")
    on_table(writer, schema, "DELETE FROM {t} WHERE id < 10")
    again = cdc_project.sync()  # from the new slot: incremental, exit 0
    assert f"{schema}.orders: incremental" in again.stderr
    assert assert_same_table(source_conn, dest_conn, schema, "orders") == 91


def test_a_slot_dropped_outside_the_tool_is_said_alike_by_status_and_sync(
    cdc_project, schema, writer, source_conn, dest_conn
):
    create_orders(writer, schema)
    configure_cdc(cdc_project, schema, "orders")
    cdc_project.sync()
    source_conn.execute("SELECT pg_drop_replication_slot(%s)", (slot_of(cdc_project),))
    on_table(writer, schema, "DELETE FROM {t} WHERE id < 10")
    status = json.loads(cdc_project.run("status", "--json").stdout)
    assert status[0]["next_action"] == "full_reload: slot dropped"
    synced = cdc_project.sync()
    assert "full_reload, 91 rows" in synced.stderr and "reason: slot dropped" in synced.stderr
    assert_same_table(source_conn, dest_conn, schema, "orders")


def test_a_source_without_logical_wal_fails_with_the_fix_and_makes_nothing(
    db_project, schema, dest_conn, pg_servers
):
    """The destination cluster runs wal_level replica: as a source, its set-up is refused
    before anything is made (it left a publication behind, and no fix)."""
    dest_conn.execute(
        sql.SQL("CREATE TABLE {} (id int PRIMARY KEY)").format(sql.Identifier(schema, "t"))
    )
    db_project.write_config(
        {"tables": [{"name": f"{schema}.t", "mode": "cdc", "destination": f"{schema}.copy"}]}
    )
    failed = db_project.run("sync", env={"REPLICATOR_SOURCE_URL": pg_servers.dest_url})
    assert failed.exit_code == 1
    assert "the source's wal_level is replica: log capture needs logical" in failed.stderr
    assert "run ALTER SYSTEM SET wal_level = logical; then restart the source server" in (
        failed.stderr
    )
    assert dest_conn.execute("SELECT pubname FROM pg_publication").fetchall() == []
    assert dest_conn.execute("SELECT slot_name FROM pg_replication_slots").fetchall() == []


def _info(status, retained):
    return SlotInfo("s", "pgoutput", 0, status, retained, 0, None)


@pytest.mark.parametrize(
    ("info", "expected"),
    [
        pytest.param(_info("reserved", 10 * MB), None, id="reserved-under-the-limit"),
        pytest.param(_info("extended", 30 * MB), "over cdc.max_retained_wal (20MB)", id="over"),
        pytest.param(_info("unreserved", MB), "wal_status unreserved", id="unreserved"),
        pytest.param(_info("lost", 0), "replicator cdc restart --repair", id="lost"),
    ],
)
def test_slot_alarms(info, expected):
    alarm = slot_alarm(info, 20 * MB, "20MB")
    assert (alarm.text if alarm else None) == expected or expected in alarm.text
    if alarm is not None:
        assert alarm.lost == (info.wal_status == "lost")


def test_a_slot_past_max_slot_wal_keep_size_is_a_warning_before_it_is_lost(
    cdc_project, schema, writer, source_conn, dest_conn, other_database, httpserver
):
    """wal_status unreserved: the source removes the slot's WAL at its next checkpoint. The
    run warns (log, webhook, status) while there is still time to sync, and exits 0."""
    create_orders(writer, schema)
    _plain(writer, schema)
    httpserver.expect_request("/hook", method="POST").respond_with_data("ok")
    _configure(cdc_project, schema, webhook={"url": httpserver.url_for("/hook")})
    cdc_project.sync()
    on_table(writer, schema, "UPDATE {t} SET note = 'waits in the slot' WHERE id <= 10")
    _write_wal(other_database, source_conn, 16)  # held by the update, not yet applied
    try:
        # no checkpoint until the test ends: one would remove the WAL (the slot: lost)
        source_conn.execute("ALTER SYSTEM SET checkpoint_timeout = '1d'")
        source_conn.execute("ALTER SYSTEM SET max_slot_wal_keep_size = '1MB'")
        source_conn.execute("SELECT pg_reload_conf()")
        # The reload reaches this session's backend a moment later: its view of the slot
        # uses the setting it has.
        wait_for(
            lambda: _slot_row(source_conn, cdc_project)[2] == "unreserved",
            30,
            "the slot's wal_status to become unreserved",
        )
        held = cdc_project.sync("-s", "plain")
        warning = f"replication slot {slot_of(cdc_project)} retains "
        assert warning in held.stderr, held.stderr
        assert "past the source's max_slot_wal_keep_size (wal_status unreserved)" in held.stderr
        warnings = httpserver.log[-1][0].get_json()["warnings"]
        assert len(warnings) == 1 and "wal_status unreserved" in warnings[0], warnings
        status = json.loads(cdc_project.run("status", "--json").stdout)
        assert status[0]["slot_warning"] == warnings[0]
        assert status[0]["next_action"] == "incremental"  # nothing lost yet
    finally:
        source_conn.execute("ALTER SYSTEM RESET max_slot_wal_keep_size")
        source_conn.execute("ALTER SYSTEM RESET checkpoint_timeout")
        source_conn.execute("SELECT pg_reload_conf()")
    applied = cdc_project.sync()
    assert "orders: incremental, 10 rows" in applied.stderr
    assert_same_table(source_conn, dest_conn, schema, "orders")
