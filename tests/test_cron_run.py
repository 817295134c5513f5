"""A cron run of cursor tables pays Python's start and imports every time: it loads only what
it runs, and none of the modules of the log (cdc), verify's comparison, Spark's session, the
report page, compile or dbt-sources."""

from __future__ import annotations

import re

from dbcompare import assert_same_table
from psycopg import sql

# What a cursor batch never runs: modules of these names, or under them.
NOT_LOADED = (
    "replicator.cdc.apply",
    "replicator.cdc.drain",
    "replicator.cdc.read",
    "replicator.cdc.rows",
    "replicator.cdc.source.pgoutput",
    "replicator.cdc.source.slot",
    "replicator.cdc.source.log_stream",
    "replicator.sync.cdc",
    "replicator.compare",
    "replicator.spark.session",
    "replicator.spark.connect_session",
    "replicator.spark.task_job",
    "replicator.spark.jvm_archive",
    "replicator.report.html",
    "replicator.report.lineage_events",
    "replicator.commands",
    "pyspark",
    "sqlglot",  # no model: the built-in SELECT is the tool's own, never parsed
    "openlineage",
    "requests",  # no webhook
    "tenacity",  # the swap's retries: a load's
)


def _loaded(importtime: str) -> set[str]:
    """The modules a `-X importtime` report lists."""
    return set(re.findall(r"^import time:\s+\d+ \|\s+\d+ \|\s+(\S+)$", importtime, re.M))


def test_a_cursor_batch_loads_none_of_the_log_verify_or_spark_modules(
    db_project, source_conn, dest_conn, schema
):
    orders = sql.Identifier(schema, "orders")
    source_conn.execute(
        sql.SQL(
            "CREATE TABLE {} (id int PRIMARY KEY, note text, updated_at timestamptz NOT NULL)"
        ).format(orders)
    )
    source_conn.execute(
        sql.SQL("CREATE INDEX ON {} (updated_at)").format(orders)  # as `check` asks
    )
    source_conn.execute(
        sql.SQL("INSERT INTO {} SELECT i, 'n' || i, now() FROM generate_series(1, 500) i").format(
            orders
        )
    )
    db_project.configure(schema, "orders", replication_key="updated_at", lookback=0)
    db_project.sync()
    source_conn.execute(
        sql.SQL("UPDATE {} SET note = 'changed', updated_at = now() WHERE id <= 50").format(orders)
    )
    source_conn.execute(sql.SQL("INSERT INTO {} VALUES (501, 'new', now())").format(orders))

    # the engine chosen as a user's run chooses it (the suite sends every copy to Spark)
    profiled = {"PYTHONPROFILEIMPORTTIME": "1"}
    batch = db_project.run_process("sync", env=profiled, drop=("REPLICATOR_SPARK_MIN_ROWS",))

    assert batch.returncode == 0, batch.stderr
    assert assert_same_table(source_conn, dest_conn, schema, "orders") == 501
    loaded = _loaded(batch.stderr)
    assert "replicator.sync.incremental.batch" in loaded, "the report lists the run's modules"
    unneeded = sorted(m for m in loaded if m.startswith(NOT_LOADED))
    assert unneeded == []
