"""What Spark prints while a run copies: nothing on the user's stderr but the run's own
lines (its one error line per failed table), and JSON only under --log-format json; -v
shows Spark's output as log records, a stack trace as one."""

from __future__ import annotations

import json
import re

import pytest
from psycopg import sql

from replicator.spark.jvm_output import Records

pytestmark = pytest.mark.spark

# Fails in the copy tasks only, at one row (the run's own reads of the model do not).
FAILING_MODEL = (
    "SELECT id, (10 / (id - CASE WHEN current_setting('application_name') = 'replicator-task' "
    "THEN 7 ELSE 0 END))::text AS v, updated_at FROM {{ source }}"
)


@pytest.fixture
def failing(db_project, source_conn, schema):
    """A table whose copy task fails on Spark (spark.min_rows 0) with division by zero."""
    source_conn.execute(
        sql.SQL(
            "CREATE TABLE {} (id bigint PRIMARY KEY, v text, "
            "updated_at timestamptz NOT NULL DEFAULT clock_timestamp())"
        ).format(sql.Identifier(schema, "t"))
    )
    source_conn.execute(
        sql.SQL("INSERT INTO {} (id) SELECT generate_series(1, 3000)").format(
            sql.Identifier(schema, "t")
        )
    )
    table = {"name": f"{schema}.t", "replication_key": "updated_at", "partitions": 2}
    db_project.write_config({"tables": [table], "spark": {"min_rows": 0}})
    db_project.write(f"models/{schema}/t.sql", FAILING_MODEL)
    return db_project


def _sync(project, *args: str):
    return project.run_process("sync", *args, drop=("REPLICATOR_SPARK_MIN_ROWS",))


def test_a_failed_spark_task_is_the_tables_one_error_line(failing, schema):
    run = _sync(failing)
    assert run.returncode == 1, run.stderr
    error = f"{schema}.t: failed after"
    assert error in run.stderr and "Spark task failed: source: division by zero" in run.stderr
    for debris in ("\tat org.apache", "Traceback", "PythonException", "ERROR Executor"):
        assert debris not in run.stderr, run.stderr
    assert "error ignored in rollback" not in run.stderr  # the Python workers' own logging
    # the run's own lines: a load's progress lines (its step, or its copy's counts) come
    # every 10 s, as many as the machine is slow (a load of 21 s here printed two)
    progress = re.compile(r": copying: |, \d+ s so far$")
    lines = [line for line in run.stderr.splitlines() if not progress.search(line)]
    assert len(lines) <= 5, run.stderr


@pytest.mark.parametrize("verbose", [(), ("-v",)], ids=["quiet", "verbose"])
def test_under_log_format_json_every_stderr_line_is_json(failing, schema, verbose):
    run = _sync(failing, "--log-format", "json", *verbose)
    assert run.returncode == 1, run.stderr
    events = [json.loads(line) for line in run.stderr.splitlines()]  # each line parses
    (finished,) = [e for e in events if e.get("event") == "table.finished"]
    assert finished["status"] == "failure"
    assert "division by zero" in finished["error"], finished
    spark = [e["message"] for e in events if e.get("event") == "spark.output"]
    if not verbose:
        assert spark == []
        return
    assert spark, "-v: Spark's own output, as records"


def test_under_v_a_java_stack_trace_is_one_json_record(db_project, source_conn, schema):
    """A task that fails in a way a retry may not repeat (its Python worker killed after
    its first MiB) is retried, and Spark logs each failure: under -v each stack trace is one
    JSON record. (A division by zero is not retried: its task reports it.)"""
    source_conn.execute(
        sql.SQL(
            "CREATE TABLE {t} (id int PRIMARY KEY, v text); "
            "INSERT INTO {t} SELECT g, repeat('v', 1000) FROM generate_series(1, 3000) g"
        ).format(t=sql.Identifier(schema, "t"))
    )
    db_project.write_config(
        {"tables": [{"name": f"{schema}.t", "mode": "full-refresh"}], "spark": {"min_rows": 0}}
    )
    run = db_project.run_process(
        "sync",
        "--log-format",
        "json",
        "-v",
        env={"REPLICATOR_FAILPOINT": "mid-extract"},
        drop=("REPLICATOR_SPARK_MIN_ROWS",),
    )
    assert run.returncode == 1, run.stderr[-2000:]
    events = [json.loads(line) for line in run.stderr.splitlines()]  # each line parses
    spark = [e["message"] for e in events if e.get("event") == "spark.output"]
    traces = [m for m in spark if "\tat org.apache.spark" in m]
    assert traces, spark
    assert all(len(m.splitlines()) > 3 for m in traces), "each trace whole, in one record"


def test_a_stack_trace_is_one_record():
    lines = [
        "26/11/24 05:55:04 ERROR Executor: Exception in task 0.0 in stage 1.0 (TID 2)",
        "org.apache.spark.api.python.PythonException: [PYTHON_EXCEPTION] An exception was "
        "thrown from the Python worker: Traceback (most recent call last):",
        '  File "/r/copy_stream.py", line 116, in run_copy_task',
        '    raise TaskError(f"source: {exc}{where}") from None',
        "replicator.base.errors.TaskError: source: division by zero",
        " SQLSTATE: 38000",
        "\tat org.apache.spark.api.python.BasePythonRunner.handlePythonException(x.scala:1)",
        "Caused by: java.io.EOFException",
        "\t... 12 more",
        "",
        "Traceback (most recent call last):",
        '  File "<string>", line 1, in <module>',
        "ZeroDivisionError: division by zero",
        "error ignored in rollback on <psycopg.Connection [ACTIVE]>: sending query failed",
        "WARNING: Using incubator modules: jdk.incubator.vector",
        "another command is already in progress",
    ]
    records = Records()
    found = [record for line in lines if (record := records.add(line))]
    found.append(records.flush())
    assert [r.splitlines()[0] for r in found] == [
        lines[0],
        "Traceback (most recent call last):",
        lines[13],
        lines[15],
    ]
    assert found[0].splitlines()[-1] == "\t... 12 more"
    assert found[1].endswith("ZeroDivisionError: division by zero")
