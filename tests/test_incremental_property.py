"""Property: whatever the interleaving of inserts, updates, long-open transactions (some
rolled back) and syncs, the destination ends equal to the source.

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
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from psycopg import sql

pytestmark = pytest.mark.spark

_names = itertools.count()

steps = st.lists(
    st.one_of(
        st.tuples(st.just("insert"), st.integers(1, 5)),
        st.tuples(st.just("update"), st.integers(0, 99)),
        st.tuples(st.just("open"), st.integers(0, 99)),
        st.tuples(st.just("commit"), st.just(0)),
        st.tuples(st.just("rollback"), st.just(0)),
        st.tuples(st.just("sync"), st.just(0)),
    ),
    min_size=3,
    max_size=14,
)


@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(plan=steps)
def test_any_interleaving_converges(db_project, source_conn, dest_conn, schema, pg_servers, plan):
    db_project.env.update(IN_PROCESS)
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
    open_txns: list[psycopg.Connection[Any]] = []
    locked: dict[int, int] = {}
    next_id, next_late = 21, 1000
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
            elif action == "open":  # writes stamped with its start time, committed later
                conn = psycopg.connect(pg_servers.source_url)
                row = 1 + arg % 10
                if arg % 2 and row not in locked.values():
                    conn.execute(
                        sql.SQL("UPDATE {} SET v = v + 7, updated_at = now() WHERE id = %s").format(
                            table
                        ),
                        (row,),
                    )
                    locked[id(conn)] = row
                else:
                    conn.execute(
                        sql.SQL("INSERT INTO {} (id, v, updated_at) VALUES (%s, 7, now())").format(
                            table
                        ),
                        (next_late,),
                    )
                    next_late += 1
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
        for conn in open_txns:
            conn.commit()
            conn.close()
    for _ in range(2):
        assert db_project.run("sync").exit_code == 0
    assert_same_table(source_conn, dest_conn, schema, name)
