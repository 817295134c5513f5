"""A big batch copied in the replicator process is staged and merged in parts, in one
destination transaction (sync/incremental/merge_pipeline.py): the copy ends equal to the
source, and a run killed part-way leaves the copy exactly as it was."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading

import pytest
from dbcompare import assert_same_table, leftovers
from engines import IN_PROCESS
from psycopg import sql
from psycopg.conninfo import make_conninfo
from waiting import wait_for

from replicator.base.errors import TaskError
from replicator.base.identifiers import TableName
from replicator.postgres.database import connect, execute
from replicator.postgres.snapshot import SessionSnapshot
from replicator.transfer.copy_stream import CopyTask, stream_in_parts
from replicator.transfer.copy_tasks import copy_tasks

pytestmark = pytest.mark.spark

ROWS = 30_000


def _create(source_conn, schema: str) -> sql.Identifier:
    table = sql.Identifier(schema, "events")
    source_conn.execute(
        sql.SQL(
            "CREATE TABLE {} (id bigint PRIMARY KEY, note text, amount numeric(12,2), "
            "doc jsonb, updated_at timestamptz NOT NULL DEFAULT clock_timestamp())"
        ).format(table)
    )
    source_conn.execute(sql.SQL("CREATE INDEX ON {} (updated_at)").format(table))
    source_conn.execute(
        sql.SQL(
            "INSERT INTO {} (id, note, amount, doc) SELECT g, md5(g::text), g / 7.0, "
            "jsonb_build_object('g', g) FROM generate_series(1, %s) g"
        ).format(table),
        (ROWS,),
    )
    return table


def _change(source_conn, table: sql.Identifier, round_no: int) -> None:
    """Most rows updated (each with a later updated_at), a thousand inserted."""
    source_conn.execute(
        sql.SQL(
            "UPDATE {} SET amount = amount + 1, note = note || %s, "
            "updated_at = clock_timestamp() WHERE id %% 7 <> 0"
        ).format(table),
        (str(round_no),),
    )
    first = ROWS + round_no * 1000
    source_conn.execute(
        sql.SQL(
            "INSERT INTO {} (id, note) SELECT g, 'new' FROM generate_series(%s::int, %s::int) g"
        ).format(table),
        (first, first + 999),
    )


def _copy_print(dest_conn, schema: str) -> str:
    (digest,) = dest_conn.execute(
        sql.SQL("SELECT md5(string_agg(t::text, '' ORDER BY id)) FROM {} AS t").format(
            sql.Identifier(schema, "events")
        )
    ).fetchone()
    return digest


@pytest.fixture
def big_batches(db_project, source_conn, schema):
    """A table loaded and a first batch merged; then as many rows changed again (26,714:
    three parts of 10,000 rows at most)."""
    table = _create(source_conn, schema)
    entry = {"name": f"{schema}.events", "replication_key": "updated_at", "lookback": 0}
    db_project.write_config({"tables": [entry]})
    assert db_project.run("sync", env=IN_PROCESS).exit_code == 0
    _change(source_conn, table, 1)
    first = db_project.run("sync", env=IN_PROCESS)
    assert first.exit_code == 0, first.output
    _change(source_conn, table, 2)
    return table


@pytest.mark.parametrize("isolation", [None, "serializable", "repeatable read"])
def test_a_batch_merged_in_parts_equals_the_source(
    db_project, source_conn, dest_conn, schema, big_batches, isolation
):
    """Whatever isolation the destination's transactions default to: the merge's transaction
    sees each part committed after it began (at REPEATABLE READ it would see none of the
    parts after the first, and the cursor would move past their rows)."""
    env = dict(IN_PROCESS)
    if isolation is not None:
        option = "-c default_transaction_isolation=" + isolation.replace(" ", "\\ ")
        env["REPLICATOR_DEST_URL"] = make_conninfo(
            db_project.env["REPLICATOR_DEST_URL"], options=option
        )
    result = db_project.run("sync", "-v", env=env)
    assert result.exit_code == 0, result.output
    assert "read in 4 partition(s) in-process" in result.stderr, result.stderr
    assert result.stderr.count("ON CONFLICT") == 3, result.stderr  # a merge per part
    assert assert_same_table(source_conn, dest_conn, schema, "events") == ROWS + 2000
    assert leftovers(dest_conn, [TableName(schema, "events")]) == []
    again = db_project.run("sync", env=IN_PROCESS)
    assert f"{schema}.events: noop" in again.stderr, again.stderr


@pytest.mark.parametrize("point", ["task-before-commit@2", "mid-merge"])
def test_a_run_killed_between_parts_leaves_the_copy_as_it_was(
    db_project, source_conn, dest_conn, schema, big_batches, point
):
    """Killed while the second part copies (the first one merged, uncommitted) or after the
    last merge before the COMMIT: no part shows; the next run converges."""
    before = _copy_print(dest_conn, schema)
    killed = db_project.run_process("sync", env={**IN_PROCESS, "REPLICATOR_FAILPOINT": point})
    assert killed.returncode == -9, f"the run did not reach {point}: {killed.stderr}"
    assert _copy_print(dest_conn, schema) == before
    again = db_project.run("sync", env=IN_PROCESS)
    assert again.exit_code == 0, again.output
    assert assert_same_table(source_conn, dest_conn, schema, "events") == ROWS + 2000
    assert leftovers(dest_conn, [TableName(schema, "events")]) == []


def _trigger_on_a_row_of_the_second_part(
    source_conn, dest_conn, schema: str, table: sql.Identifier, name: str, action: str
) -> int:
    """A trigger `name` on the copy that runs `action` (`{id}`: the row's key) when the merge
    writes a row the batch holds in its second part (10,000 rows each); that row's key."""
    (row,) = source_conn.execute(
        sql.SQL(
            "SELECT id FROM {} WHERE updated_at >= (SELECT max(updated_at) - interval '1 hour' "
            "FROM {}) ORDER BY updated_at LIMIT 1 OFFSET 15000"
        ).format(table, table)
    ).fetchone()
    dest_conn.execute(
        sql.SQL(
            "CREATE FUNCTION {f}() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
            "IF NEW.id = {id} THEN " + action + "; END IF; RETURN NEW; END $$; "
            "CREATE TRIGGER {n} BEFORE UPDATE OR INSERT ON {t} "
            "FOR EACH ROW EXECUTE FUNCTION {f}()"
        ).format(
            f=sql.Identifier(schema, name),
            n=sql.Identifier(name),
            id=sql.Literal(row),
            t=sql.Identifier(schema, "events"),
        )
    )
    return row


def test_a_part_that_fails_to_merge_leaves_the_copy_as_it_was(
    db_project, source_conn, dest_conn, schema, big_batches
):
    """The second part's merge fails (a trigger on the copy refuses one of its rows): the
    copy stops, the parts merged before roll back with it, the table fails (exit 1) saying
    why, and nothing is left behind; the next table syncs on the run's source session, which
    the batch was read in; the next run converges."""
    before = _copy_print(dest_conn, schema)
    row = _trigger_on_a_row_of_the_second_part(
        source_conn, dest_conn, schema, big_batches, "refuse", "RAISE EXCEPTION 'row {id} refused'"
    )
    source_conn.execute(
        sql.SQL("CREATE TABLE {} AS SELECT g AS id FROM generate_series(1, 5) g").format(
            sql.Identifier(schema, "after")
        )
    )
    entry = {"name": f"{schema}.events", "replication_key": "updated_at", "lookback": 0}
    after = {"name": f"{schema}.after", "mode": "full-refresh"}
    db_project.write_config({"tables": [entry, after]})
    failed = db_project.run("sync", env=IN_PROCESS)
    assert failed.exit_code == 1, failed.output
    assert f"row {row} refused" in failed.stderr, failed.stderr
    assert "connecting again" not in failed.stderr, failed.stderr
    assert assert_same_table(source_conn, dest_conn, schema, "after") == 5
    assert _copy_print(dest_conn, schema) == before
    assert leftovers(dest_conn, [TableName(schema, "events")]) == []
    dest_conn.execute(sql.SQL("DROP TRIGGER refuse ON {}").format(sql.Identifier(schema, "events")))
    again = db_project.run("sync", env=IN_PROCESS)
    assert again.exit_code == 0, again.output
    assert assert_same_table(source_conn, dest_conn, schema, "events") == ROWS + 2000


def test_sigterm_while_a_part_merges_leaves_the_copy_as_it_was(
    db_project, source_conn, dest_conn, schema, big_batches, tmp_path
):
    """SIGTERM while the second part's merge runs (a trigger makes one of its rows sleep):
    both threads' queries are cancelled, the run exits 143 saying so, without a traceback,
    the copy is as it was and nothing is left behind."""
    before = _copy_print(dest_conn, schema)
    _trigger_on_a_row_of_the_second_part(
        source_conn, dest_conn, schema, big_batches, "slow", "PERFORM pg_sleep(120)"
    )
    err = tmp_path / "stderr"
    with err.open("w") as stderr:
        process = subprocess.Popen(
            [sys.executable, "-m", "replicator", "sync", "--project-dir", str(db_project.path)],
            env={**os.environ, **db_project.env, **IN_PROCESS},
            stdout=subprocess.DEVNULL,
            stderr=stderr,
            stdin=subprocess.DEVNULL,
        )
    try:
        wait_for(
            lambda: dest_conn.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE wait_event = 'PgSleep' "
                "AND query LIKE %s",
                (f"%{schema}%",),
            ).fetchone()[0],
            120,
            "the merge to reach the sleeping row",
        )
        process.send_signal(signal.SIGTERM)
        code = process.wait(timeout=60)
    finally:
        process.kill()
    output = err.read_text()
    assert code == 143, output
    assert "run interrupted by SIGTERM" in output
    assert "Traceback" not in output, output
    assert _copy_print(dest_conn, schema) == before
    assert leftovers(dest_conn, [TableName(schema, "events")]) == []


@pytest.mark.parametrize("rows", [0, 1, 9, 10, 11, 20, 30, 40, 45])
def test_the_stream_cut_in_parts_lands_every_row_once(
    pg_servers, source_conn, dest_conn, schema, rows
):
    """COPY's binary form cut at any row count (none, one part's worth, exactly at a part's
    end, into the last part): each part is a COPY the destination reads, and every row
    lands once, in order of the parts."""
    source_conn.execute(
        sql.SQL("CREATE TABLE {} (id int PRIMARY KEY, v text, n numeric)").format(
            sql.Identifier(schema, "s")
        )
    )
    source_conn.execute(
        sql.SQL(
            "INSERT INTO {} SELECT g, repeat('x', g), g / 3.0 FROM generate_series(1, %s) g"
        ).format(sql.Identifier(schema, "s")),
        (rows,),
    )
    tables = [f"p{k}" for k in range(4)]
    for name in tables:
        dest_conn.execute(
            sql.SQL("CREATE TABLE {} (id int, v text, n numeric)").format(
                sql.Identifier(schema, name)
            )
        )
    landed: list[int] = []
    with connect(pg_servers.source_url, "source") as session, SessionSnapshot(session):
        result = stream_in_parts(
            session, _part_tasks(pg_servers, schema, tables), 10, landed.append, threading.Event()
        )
    assert result.rows == rows
    held = [
        [
            r[0]
            for r in dest_conn.execute(
                sql.SQL("SELECT id FROM {} ORDER BY id").format(sql.Identifier(schema, name))
            )
        ]
        for name in tables
    ]
    assert [i for part in held for i in part] == list(range(1, rows + 1))
    assert [len(part) for part in held[:3]] == [min(10, max(0, rows - 10 * k)) for k in range(3)]
    assert landed == list(range(len(landed))) and landed, landed


def _part_tasks(pg_servers, schema: str, tables: list[str]) -> list[CopyTask]:
    """The tasks of a stream of `schema`.s, in key order, cut into `tables`."""
    query = sql.SQL("SELECT * FROM {} ORDER BY id").format(sql.Identifier(schema, "s"))
    return [
        task
        for k, name in enumerate(tables)
        for task in copy_tasks(
            "test-load",
            pg_servers.source_url,
            pg_servers.dest_url,
            "",
            [query],
            (schema, name),
            ["id", "v", "n"],
            parts=[k],
        )
    ]


def test_a_stream_stopped_part_way_leaves_the_source_session_usable(
    pg_servers, source_conn, dest_conn, schema
):
    """The merge of a part failed while the source still sends rows: the stream stops, its
    COPY out is cancelled and the rest of it dropped, and the run's source session (whose
    transaction the batch was read in) goes on to the next table."""
    source_conn.execute(
        sql.SQL(
            "CREATE TABLE {} AS SELECT g AS id, repeat('x', 100) AS v, g / 3.0 AS n "
            "FROM generate_series(1, 200000) g"
        ).format(sql.Identifier(schema, "s"))
    )
    tables = [f"p{k}" for k in range(4)]
    for name in tables:
        dest_conn.execute(
            sql.SQL("CREATE TABLE {} (id int, v text, n numeric)").format(
                sql.Identifier(schema, name)
            )
        )
    stop = threading.Event()
    with connect(pg_servers.source_url, "source") as session:
        with SessionSnapshot(session), pytest.raises(TaskError, match="the merge failed"):
            stream_in_parts(
                session, _part_tasks(pg_servers, schema, tables), 10, lambda _: stop.set(), stop
            )
        assert not session.closed
        (count,) = execute(
            session, sql.SQL("SELECT count(*) FROM {}").format(sql.Identifier(schema, "s"))
        ).fetchone()
    assert count == 200_000
    (first,) = dest_conn.execute(
        sql.SQL("SELECT count(*) FROM {}").format(sql.Identifier(schema, "p0"))
    ).fetchone()
    assert first == 10


def test_a_batch_the_probe_did_not_count_is_taken_as_big_as_the_last_one(
    db_project, source_conn, dest_conn, schema, big_batches, tmp_path
):
    """Where Spark cannot take a batch (a local master on two task slots), the probe stops
    counting at the rows the cursor had: the batch is taken to be as big as the last one,
    whatever no-op runs came between."""
    unmeasured = {
        "REPLICATOR_SPARK_MIN_ROWS": None,
        "REPLICATOR_SPARK_MASTER": "local[2]",
        "REPLICATOR_CACHE_DIR": str(tmp_path / "cache"),  # no figures: Spark never wins
    }
    assert db_project.run("sync", env=unmeasured).exit_code == 0
    noop = db_project.run("sync", env=unmeasured)
    assert f"{schema}.events: noop" in noop.stderr, noop.stderr
    _change(source_conn, big_batches, 3)
    result = db_project.run("sync", "-v", env=unmeasured)
    assert result.exit_code == 0, result.output
    assert "read in 4 partition(s) in-process" in result.stderr, result.stderr
    assert assert_same_table(source_conn, dest_conn, schema, "events") == ROWS + 3000
