"""A source table altered while a run copies it: the copy gives way, never a deadlock.

The run's snapshot session holds a share lock on the tables it read. An ALTER TABLE (or an
ATTACH PARTITION beside a DEFAULT partition) then waits for that session, and PostgreSQL
queues the run's own copy sessions behind the ALTER: each waits for the other, and neither
side can see it, since the snapshot session only waits on its client. The copy's lock wait
is bounded, so the run fails that table, the ALTER goes through, and the next run copies it.

That is the general way of a batch (sync/incremental/batch.py), which Spark's tasks take. A
batch copied directly reads and copies on the one session that holds the lock: no session
of its own queues behind the ALTER.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading

import psycopg
import pytest
from dbcompare import assert_same_table
from psycopg import sql
from waiting import wait_for

from replicator.postgres.naming import MARKER_TABLE


def _waiting_locks(conn, relation: str | None = None) -> int:
    """How many lock requests wait on this server (on `relation`, when named)."""
    query = "SELECT count(*) FROM pg_locks WHERE NOT granted"
    params: tuple = ()
    if relation is not None:
        query += " AND relation = to_regclass(%s)"
        params = (relation,)
    return conn.execute(query, params).fetchone()[0]


@pytest.mark.parametrize("engine", [{}], ids=["spark"])
def test_an_alter_table_during_a_copy_makes_the_copy_give_way(
    db_project, pg_servers, source_conn, dest_conn, schema, engine
):
    table = sql.Identifier(schema, "orders")
    source_conn.execute(
        sql.SQL(
            "CREATE TABLE {} (id bigint PRIMARY KEY, note text, "
            "updated_at timestamptz NOT NULL DEFAULT clock_timestamp())"
        ).format(table)
    )
    source_conn.execute(
        sql.SQL(
            "INSERT INTO {} (id, note) SELECT g, 'n' || g FROM generate_series(1, 500) g"
        ).format(table)
    )
    db_project.write_config(
        {"tables": [{"name": f"{schema}.orders", "replication_key": "updated_at"}]}
    )
    assert db_project.run("sync", env=engine).exit_code == 0
    source_conn.execute(
        sql.SQL(
            "UPDATE {} SET note = 'again', updated_at = clock_timestamp() WHERE id <= 50"
        ).format(table)
    )

    # The destination's marker table held: the batch stops after its snapshot read the table.
    holder = psycopg.connect(pg_servers.dest_url)
    holder.execute(sql.SQL("LOCK TABLE {} IN EXCLUSIVE MODE").format(MARKER_TABLE.identifier()))
    env = {**os.environ, **db_project.env, **engine}
    run = subprocess.Popen(
        [sys.executable, "-m", "replicator", "sync", "--project-dir", str(db_project.path)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_for(lambda: _waiting_locks(dest_conn, MARKER_TABLE.sql()), 120, "the run's batch")
        # The application's ALTER waits for the run's snapshot session...
        altered = threading.Event()

        def alter() -> None:
            with psycopg.connect(pg_servers.source_url, autocommit=True) as conn:
                conn.execute(sql.SQL("ALTER TABLE {} ADD COLUMN extra int").format(table))
            altered.set()

        threading.Thread(target=alter, daemon=True).start()
        name = f"{schema}.orders"
        wait_for(lambda: _waiting_locks(source_conn, name), 60, "the ALTER to wait")
        holder.rollback()  # ...and the copy then queues behind the ALTER.
        _, stderr = run.communicate(timeout=120)
    finally:
        holder.close()
        if run.poll() is None:
            run.kill()
            run.communicate()
    assert run.returncode == 1, stderr
    assert f"{schema}.orders: " in stderr and "exclusive lock request" in stderr, stderr
    assert "the next run reads the table again" in stderr, stderr
    wait_for(altered.is_set, 60, "the ALTER to go through")

    again = db_project.run("sync", env=engine)
    assert again.exit_code == 0, again.output
    assert assert_same_table(source_conn, dest_conn, schema, "orders") == 500
