"""Property: whatever the interleaving of inserts, updates, long-open transactions (some
rolled back, some that write only later, some that took their xid before a newer writer
did) and syncs, read by a superuser or by a role without monitoring privileges, the
destination ends equal to the source.

The copies run in this process: a copy task, and the run's exported snapshot it reads, are
the same on Spark (test_incremental.py's batches go through Spark); a Spark job per sync
only doubled this test's time."""

from __future__ import annotations

import itertools
from typing import Any

import psycopg
import pytest
from dbcompare import assert_same_table
from engines import IN_PROCESS
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from psycopg import sql

pytestmark = pytest.mark.spark

_names = itertools.count()

steps = st.lists(
    st.one_of(
        st.tuples(st.just("insert"), st.integers(1, 5)),
        st.tuples(st.just("update"), st.integers(0, 99)),
        st.tuples(st.just("open"), st.integers(0, 99)),
        st.tuples(st.just("begin"), st.just(0)),  # a transaction that writes only later
        st.tuples(st.just("write"), st.integers(0, 99)),  # the oldest begun one writes
        st.tuples(st.just("hold"), st.just(0)),  # an xid taken now, on a row of its own
        st.tuples(st.just("commit"), st.just(0)),
        st.tuples(st.just("rollback"), st.just(0)),
        st.tuples(st.just("sync"), st.just(0)),
    ),
    min_size=3,
    max_size=14,
)


# The newest writer: it began first, a newer transaction took its xid before it wrote and
# committed first, and the sync ran in between (the snapshot's list leaves it out).
NEWEST_WRITER = [("begin", 0), ("hold", 0), ("write", 1), ("commit", 0), ("sync", 0)]


@example(plan=NEWEST_WRITER, least_privilege=False)
@example(plan=NEWEST_WRITER, least_privilege=True)
@example(plan=[("begin", 0), ("update", 3), ("sync", 0), ("write", 1)], least_privilege=True)
@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(plan=steps, least_privilege=st.booleans())
def test_any_interleaving_converges(
    db_project, source_conn, dest_conn, schema, pg_servers, loader_role, plan, least_privilege
):
    db_project.env.update(IN_PROCESS)
    if least_privilege:
        db_project.env["REPLICATOR_SOURCE_URL"] = loader_role
    name = f"t{next(_names)}"
    table = sql.Identifier(schema, name)
    source_conn.execute(
        sql.SQL(
            "CREATE TABLE {} (id int PRIMARY KEY, v int NOT NULL, "
            "updated_at timestamptz NOT NULL DEFAULT clock_timestamp())"
        ).format(table)
    )
    source_conn.execute(sql.SQL("CREATE INDEX ON {} (updated_at)").format(table))
    source_conn.execute(
        sql.SQL("INSERT INTO {} (id, v) SELECT g, 0 FROM generate_series(1, 20) g").format(table)
    )
    db_project.write_config(
        {"tables": [{"name": f"{schema}.{name}", "replication_key": "updated_at", "lookback": 0}]}
    )
    assert db_project.run("sync").exit_code == 0
    open_txns: list[psycopg.Connection[Any]] = []  # open, in the order they wrote
    begun: list[psycopg.Connection[Any]] = []  # open, not written yet
    locked: dict[int, int] = {}
    next_id, next_late, next_held = 21, 1000, 5000

    def late_write(conn: psycopg.Connection[Any], arg: int) -> None:
        """A write stamped with the transaction's start (now()), committed later."""
        nonlocal next_late
        row = 1 + arg % 10
        if arg % 2 and row not in locked.values():
            conn.execute(
                sql.SQL("UPDATE {} SET v = v + 7, updated_at = now() WHERE id = %s").format(table),
                (row,),
            )
            locked[id(conn)] = row
        else:
            conn.execute(
                sql.SQL("INSERT INTO {} (id, v, updated_at) VALUES (%s, 7, now())").format(table),
                (next_late,),
            )
            next_late += 1
        open_txns.append(conn)

    try:
        for action, arg in plan:
            if action == "insert":
                source_conn.execute(
                    sql.SQL(
                        "INSERT INTO {} (id, v) "
                        "SELECT g, 1 FROM generate_series(%s::int, %s::int) g"
                    ).format(table),
                    (next_id, next_id + arg - 1),
                )
                next_id += arg
            elif action == "update":  # rows 11.. only: rows 1-10 belong to open transactions
                source_conn.execute(
                    sql.SQL(
                        "UPDATE {} SET v = v + 1, updated_at = clock_timestamp() WHERE id = %s"
                    ).format(table),
                    (11 + arg % (next_id - 11),),
                )
            elif action == "open":
                late_write(psycopg.connect(pg_servers.source_url), arg)
            elif action == "begin":
                conn = psycopg.connect(pg_servers.source_url)
                conn.execute("SELECT 1")  # its now() is this moment; no xid yet
                begun.append(conn)
            elif action == "write" and begun:
                late_write(begun.pop(0), arg)
            elif action == "hold":  # an xid now, a row stamped now, committed later
                conn = psycopg.connect(pg_servers.source_url)
                conn.execute(
                    sql.SQL("INSERT INTO {} (id, v) VALUES (%s, 3)").format(table), (next_held,)
                )
                next_held += 1
                open_txns.append(conn)
            elif action in ("commit", "rollback") and open_txns:
                conn = open_txns.pop(0)
                locked.pop(id(conn), None)
                conn.commit() if action == "commit" else conn.rollback()
                conn.close()
            elif action == "sync":
                result = db_project.run("sync")
                assert result.exit_code == 0, result.output
    finally:
        for conn in [*open_txns, *begun]:
            conn.commit()
            conn.close()
    for _ in range(2):
        assert db_project.run("sync").exit_code == 0
    assert_same_table(source_conn, dest_conn, schema, name)
