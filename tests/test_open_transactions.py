"""A cursor never passes a row that a transaction open at the read commits later, whoever
reads (a superuser, a role without any monitoring privilege, a standby) and whatever the key
(a timestamp stamped with now(), an identity).

The schedules that used to lose the late row, exit 0:
- the newest writer: it took the newest xid, and the transaction that committed last took
  an older one, so the snapshot's xmax stops at it and its list leaves it out;
- a writer that had not written yet: it began before the read (now() is its start) and
  writes after it.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import psycopg
import pytest
from dbcompare import assert_same_table
from engines import IN_PROCESS
from psycopg import sql
from standby import Standby, start_standby

TIMESTAMP_TABLE = (
    "CREATE TABLE {} (id int PRIMARY KEY, v int NOT NULL, "
    "updated_at timestamptz NOT NULL DEFAULT clock_timestamp())"
)


@dataclass(frozen=True)
class Reader:
    """Who the sync reads the source as: a URL, and what the test calls it."""

    url: str
    name: str


@pytest.fixture(scope="module")
def standby(pg_servers) -> Iterator[Standby]:
    """A hot standby of the source server, streaming from it."""
    with start_standby(pg_servers.source_url) as server:
        yield server


def _table(source_conn: psycopg.Connection[Any], schema: str) -> sql.Identifier:
    table = sql.Identifier(schema, "events")
    source_conn.execute(sql.SQL(TIMESTAMP_TABLE).format(table))
    source_conn.execute(sql.SQL("CREATE INDEX ON {} (updated_at)").format(table))
    source_conn.execute(
        sql.SQL("INSERT INTO {} (id, v) SELECT g, 0 FROM generate_series(1, 20) g").format(table)
    )
    return table


def _configure(db_project, schema: str, reader_url: str, key: str = "updated_at") -> None:
    db_project.env.update(IN_PROCESS, REPLICATOR_SOURCE_URL=reader_url)
    db_project.write_config(
        {"tables": [{"name": f"{schema}.events", "replication_key": key, "lookback": 0}]}
    )


def _sync(db_project, replayed: Standby | None = None) -> None:
    if replayed is not None:
        replayed.caught_up()
    result = db_project.run("sync")
    assert result.exit_code == 0, result.output


def _newest_writer_schedule(
    url: str, table: sql.Identifier, sync: Any, first_write: str = "now()"
) -> None:
    """The late writer begins, a second transaction begins after it and takes its xid first
    (with a later stamp), the late writer writes its row stamped now() (the newest xid), the
    second commits, the sync runs, then the late writer commits."""
    late = psycopg.connect(url)
    other = psycopg.connect(url)
    try:
        late.execute("SELECT 1")  # its now() is this moment
        other.execute(
            sql.SQL("UPDATE {} SET v = v + 1, updated_at = clock_timestamp() WHERE id = 2").format(
                table
            )
        )
        late.execute(
            sql.SQL(f"UPDATE {{}} SET v = 99, updated_at = {first_write} WHERE id = 1").format(
                table
            )
        )
        other.commit()
        sync()
        late.commit()
    finally:
        late.close()
        other.close()


def _not_yet_written_schedule(url: str, table: sql.Identifier, sync: Any) -> None:
    """The late writer begins and reads; another row commits with a later stamp; the sync
    runs; only then does the late writer write its row stamped now() and commit."""
    late = psycopg.connect(url)
    try:
        late.execute("SELECT 1")
        with psycopg.connect(url, autocommit=True) as other:
            other.execute(
                sql.SQL(
                    "UPDATE {} SET v = v + 1, updated_at = clock_timestamp() WHERE id = 2"
                ).format(table)
            )
        sync()
        late.execute(sql.SQL("UPDATE {} SET v = 99, updated_at = now() WHERE id = 1").format(table))
        late.commit()
    finally:
        late.close()


@pytest.mark.parametrize("role", ["superuser", "least-privilege"])
def test_the_newest_writer_commits_after_the_sync_and_is_not_lost(
    db_project, source_conn, dest_conn, schema, pg_servers, loader_role, role
):
    table = _table(source_conn, schema)
    _configure(db_project, schema, pg_servers.source_url if role == "superuser" else loader_role)
    _sync(db_project)
    _newest_writer_schedule(pg_servers.source_url, table, lambda: _sync(db_project))
    _sync(db_project)
    assert_same_table(source_conn, dest_conn, schema, "events")


@pytest.mark.parametrize("role", ["superuser", "least-privilege"])
def test_a_transaction_that_writes_only_after_the_sync_read_is_not_lost(
    db_project, source_conn, dest_conn, schema, pg_servers, loader_role, role
):
    table = _table(source_conn, schema)
    _configure(db_project, schema, pg_servers.source_url if role == "superuser" else loader_role)
    _sync(db_project)
    _not_yet_written_schedule(pg_servers.source_url, table, lambda: _sync(db_project))
    _sync(db_project)
    assert_same_table(source_conn, dest_conn, schema, "events")


def test_an_identity_key_drawn_by_the_newest_writer_is_not_lost(
    db_project, source_conn, dest_conn, schema, pg_servers, loader_role
):
    """The late writer draws id 21 and writes it with the newest xid; another transaction
    that took its xid earlier inserts id 22 and commits; the sync sees 22."""
    table = sql.Identifier(schema, "events")
    source_conn.execute(
        sql.SQL(
            "CREATE TABLE {} (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, v int)"
        ).format(table)
    )
    source_conn.execute(
        sql.SQL("INSERT INTO {} (v) SELECT 0 FROM generate_series(1, 20)").format(table)
    )
    elsewhere = sql.Identifier(schema, "elsewhere")
    source_conn.execute(sql.SQL("CREATE TABLE {} (v int)").format(elsewhere))
    _configure(db_project, schema, loader_role, key="id")
    _sync(db_project)
    late = psycopg.connect(pg_servers.source_url)
    other = psycopg.connect(pg_servers.source_url)
    try:
        other.execute(sql.SQL("INSERT INTO {} VALUES (1)").format(elsewhere))  # its xid
        late.execute(sql.SQL("INSERT INTO {} (v) VALUES (21)").format(table))  # id 21
        other.execute(sql.SQL("INSERT INTO {} (v) VALUES (22)").format(table))  # id 22
        other.commit()
        _sync(db_project)
        late.commit()
    finally:
        late.close()
        other.close()
    _sync(db_project)
    assert_same_table(source_conn, dest_conn, schema, "events")


def test_a_sync_that_reads_a_standby_does_not_lose_the_newest_writer(
    db_project, source_conn, dest_conn, schema, pg_servers, standby
):
    """A standby's snapshot lists no transaction in progress at all."""
    table = _table(source_conn, schema)
    _configure(db_project, schema, standby.url)
    _sync(db_project, standby)
    _newest_writer_schedule(pg_servers.source_url, table, lambda: _sync(db_project, standby))
    _sync(db_project, standby)
    assert_same_table(source_conn, dest_conn, schema, "events")


def test_check_says_which_protection_the_role_gets(
    db_project, source_conn, schema, pg_servers, loader_role, standby
):
    _table(source_conn, schema)
    standby.caught_up()
    expectations = {
        pg_servers.source_url: "ok    source: role postgres sees every session's transaction start",
        loader_role: "ok    source: role lp_",
        standby.url: "warn  source: the source is a standby: a cursor waits for every transaction",
    }
    for url, phrase in expectations.items():
        _configure(db_project, schema, url)
        checked = db_project.run("check")
        assert phrase in checked.stdout, checked.stdout
    assert (
        "waits for every transaction open at the read"
        in db_project.run("check", env={"REPLICATOR_SOURCE_URL": loader_role}).stdout
    )


def test_a_cursor_held_back_says_so_in_the_log_and_status(
    db_project, source_conn, schema, pg_servers, loader_role
):
    """An open transaction holds the cursor back: the sync says so, naming its session, and
    `status` shows it, until the transaction ends (a session left idle in a transaction held
    every cursor back without a word)."""
    table = _table(source_conn, schema)
    _configure(db_project, schema, loader_role)
    _sync(db_project)
    idle = psycopg.connect(pg_servers.source_url)
    try:
        idle.execute("SELECT 1")  # idle in a transaction, as a forgotten session is
        (pid,) = idle.execute("SELECT pg_backend_pid()").fetchone()
        source_conn.execute(
            sql.SQL("UPDATE {} SET v = 5, updated_at = clock_timestamp() WHERE id = 3").format(
                table
            )
        )
        held = db_project.run("sync")
        assert held.exit_code == 0, held.output
        assert f"{schema}.events: the cursor waits at " in held.stderr, held.stderr
        assert f"(pid {pid})" in held.stderr
        (row,) = json.loads(db_project.run("status", "--json").stdout)
        assert row["cursor_waits"]["pids"] == [pid] and row["cursor_waits"]["since"], row
        assert (
            "the cursor waits for transactions open when its last batch"
            in db_project.run("status").output
        )
    finally:
        idle.close()
    source_conn.execute(
        sql.SQL("UPDATE {} SET v = 6, updated_at = clock_timestamp() WHERE id = 4").format(table)
    )
    moved = db_project.run("sync")
    assert moved.exit_code == 0 and "the cursor waits" not in moved.stderr, moved.stderr
    (row,) = json.loads(db_project.run("status", "--json").stdout)
    assert row["cursor_waits"] is None, row
