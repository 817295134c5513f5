"""The command line keeps dbt's conventions: shared options before or after the command,
`--log-format json` and `-q` honoured by every command, `--help` that teaches (examples,
environment, exit codes), and errors that say which side and which file they come from."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import uuid

import pytest
from engines import IN_PROCESS
from psycopg import sql

pytestmark = pytest.mark.spark


@pytest.fixture
def shop(db_project, source_conn, schema):
    table = sql.Identifier(schema, "orders")
    source_conn.execute(
        sql.SQL(
            "CREATE TABLE {} (id int PRIMARY KEY, amount int, "
            "updated_at timestamptz NOT NULL DEFAULT now())"
        ).format(table)
    )
    source_conn.execute(sql.SQL("CREATE INDEX ON {} (updated_at)").format(table))
    source_conn.execute(
        sql.SQL("INSERT INTO {} (id, amount) SELECT g, g FROM generate_series(1, 40) g").format(
            table
        )
    )
    db_project.write_config(
        {"tables": [{"name": f"{schema}.orders", "replication_key": "updated_at"}]}
    )
    return schema


def _json_lines(text: str) -> list[dict]:
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def test_shared_options_work_before_the_command_name(db_project, shop):
    after = db_project.run_process("status", "--json")
    before = db_project.run_process(
        "--project-dir", str(db_project.path), "--log-format", "json", "status"
    )
    assert after.returncode == before.returncode == 0, before.stderr
    assert json.loads(before.stdout) == json.loads(after.stdout)
    quiet = db_project.run_process("-q", "refresh", "orders")
    assert quiet.returncode == 0 and quiet.stdout == "", quiet.stdout


COMMANDS = [
    ("check",),
    ("compile",),
    ("status",),
    ("state", "show"),
    ("refresh", "orders"),
    ("state", "reset", "orders"),
    ("sync",),
    ("sync", "-s", "nope"),  # an error: exit 2, as a JSON object
    ("state", "set-cursor", "orders", "2020-01-01 00:00:00+00"),
    ("adopt", "orders"),
    ("status", "--json"),
    ("status", "--history"),
    ("report",),
    ("spark", "status"),  # printed text before (a newcomer trial)
    ("verify",),
]


def test_every_command_prints_only_json_under_log_format_json(db_project, shop):
    """Spark's own output under json: tests/test_jvm_output.py."""
    db_project.env.update(IN_PROCESS)
    codes = {}
    for args in COMMANDS:
        done = db_project.run_process(*args, "--log-format", "json")
        codes[args] = done.returncode
        for stream in (done.stdout, done.stderr):
            for line in stream.splitlines():
                assert line.strip() == "" or isinstance(json.loads(line), dict | list), (
                    args,
                    line,
                )
    assert codes[("sync", "-s", "nope")] == 2
    assert codes[("sync",)] == 0
    error = _json_lines(
        db_project.run_process("sync", "-s", "nope", "--log-format", "json").stderr
    )[-1]
    assert error["event"] == "command.failed" and error["exit_code"] == 2
    assert "table nope is not in tables-config.json" in error["message"]
    findings = _json_lines(db_project.run_process("check", "--log-format", "json").stdout)
    assert findings[-1] == {"event": "check.finished", "errors": 0, "warnings": 0}
    assert all(f["event"] == "check.finding" for f in findings[:-1])


def test_quiet_prints_only_warnings_and_errors(db_project, shop):
    """A quiet run through Spark: test_operations.py,
    test_a_long_copy_logs_its_progress_off_a_terminal."""
    db_project.env.update(IN_PROCESS)
    assert db_project.run_process("sync", "-q").stderr == ""
    checked = db_project.run_process("check", "-q")
    assert checked.returncode == 0
    assert checked.stdout == "0 error(s), 0 warning(s)\n", checked.stdout
    for args in (("refresh", "orders"), ("state", "reset", "orders"), ("adopt", "orders")):
        done = db_project.run_process(*args, "-q")
        assert done.returncode == 0 and done.stdout == "" and done.stderr == "", args


def test_help_teaches(db_project):
    top = db_project.run_process("--help")
    assert top.returncode == 0
    for text in ("Examples:", "REPLICATOR_SOURCE_URL", "REPLICATOR_WEBHOOK_SECRET", "Exit codes:"):
        assert text in top.stdout
    assert re.search(r"^\s+75\s+another replicator holds the lock", top.stdout, re.M)
    commands = top.stdout.split("Commands:")[1].split("Examples:")[0]
    assert "..." not in commands, "no command summary is cut"
    names = re.findall(r"^  (\S+)\s", commands, re.M)
    assert {"sync", "status", "check", "compile", "adopt", "demo"} <= set(names)
    for name in names:
        done = db_project.run_process(name, "--help")
        assert done.returncode == 0, name
        assert "Examples:" in done.stdout or name == "state", name


def test_errors_name_the_side_and_the_file(db_project, shop, source_conn):
    """A model that fails in the source names the source and the model file; a project
    macro that fails in the destination names the destination and the macro's file; -v
    shows the failing statement and the traceback."""
    db_project.write(
        f"models/{shop}/orders.sql",
        "SELECT id, (100 / (amount - 7))::int AS amount, updated_at FROM {{ source }}",
    )
    for min_rows in ("0", "1000000000"):  # on Spark, and in this process
        failed = db_project.run("sync", env={"REPLICATOR_SPARK_MIN_ROWS": min_rows})
        assert failed.exit_code == 1
        assert f"source: division by zero (reading models/{shop}/orders.sql)" in failed.stderr, (
            failed.stderr
        )
    db_project.write(f"models/{shop}/orders.sql", "SELECT * FROM {{ source }}")
    assert db_project.run("sync").exit_code == 0
    db_project.write(
        "macros/merge.sql",
        "{% macro merge_deduped(target, staging, columns) %}"
        "INSERT INTO {{ target }} SELECT * FROM {{ staging }} WHERE no_such_column"
        "{% endmacro %}",
    )
    source_conn.execute(
        sql.SQL(
            "UPDATE {} SET amount = 0, updated_at = now() + interval '1 min' WHERE id = 1"
        ).format(sql.Identifier(shop, "orders"))
    )
    failed = db_project.run("sync", "-v")
    assert failed.exit_code == 1
    assert (
        'destination: column "no_such_column" does not exist (in the merge, macro '
        "merge_deduped (" in failed.stderr
    ), failed.stderr
    assert "macros/merge.sql)" in failed.stderr
    assert "WHERE no_such_column" in failed.stderr, "the statement, under -v"
    assert "Traceback (most recent call last)" in failed.stderr, "the traceback, under -v"


def test_hints_name_the_role_they_mean(db_project, shop, source_conn, pg_servers):
    role = f"reader_{uuid.uuid4().hex[:8]}"
    source_conn.execute(sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(role)))
    try:
        source_conn.execute(
            sql.SQL("GRANT USAGE ON SCHEMA {} TO {}").format(
                sql.Identifier(shop), sql.Identifier(role)
            )
        )
        url = pg_servers.source_url.replace("postgres@", f"{role}@", 1)
        checked = db_project.run_process("check", env={"REPLICATOR_SOURCE_URL": url})
        assert checked.returncode == 1
        assert f"fix: GRANT SELECT ON {shop}.orders TO {role}" in checked.stdout
        assert "<" not in checked.stdout, "no placeholder where the tool knows the name"
    finally:
        source_conn.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(role)))
        source_conn.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))


def test_a_closed_pipe_ends_quietly(db_project, source_conn, schema):
    """`replicator compile | head -1` (the README's own example, on a bigger project): the
    reader closes the pipe early; exit 0, nothing on stderr."""
    for number in range(40):
        source_conn.execute(
            sql.SQL("CREATE TABLE {} (id int PRIMARY KEY, v text)").format(
                sql.Identifier(schema, f"t{number}")
            )
        )
    db_project.write_config(
        {"tables": [{"name": f"{schema}.t{n}", "mode": "full-refresh"} for n in range(40)]}
    )
    for command in ("compile", "status --log-format json", "state show"):
        done = subprocess.run(
            [
                "bash",
                "-o",
                "pipefail",
                "-c",
                f"{sys.executable} -m replicator {command} --project-dir {db_project.path} "
                "| head -c 10",
            ],
            env={**os.environ, **db_project.env},
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, (command, done.stderr)
        assert done.stderr == "", (command, done.stderr)


def test_usage_errors_follow_log_format_json(db_project):
    for args in (("refresh",), ("sync", "--bogus"), ("bogus",)):
        done = db_project.run_process("--log-format", "json", *args)
        assert done.returncode == 2, args
        (error,) = _json_lines(done.stderr)
        assert error["event"] == "command.failed" and error["exit_code"] == 2, error


def test_verbose_shows_sql_not_library_chatter(db_project, shop):
    done = db_project.run_process("status", "-v")
    assert re.search(r"sql:\s+SELECT", done.stderr), done.stderr
    assert "connection polled" not in done.stderr and "PGconn" not in done.stderr
    assert "connection polled" in db_project.run_process("status", "-vv").stderr


def test_json_says_when_a_table_starts(db_project, shop):
    synced = db_project.run_process("sync", "--log-format", "json", env=IN_PROCESS)
    started = [e for e in _json_lines(synced.stderr) if e.get("event") == "table.started"]
    assert started == [
        started[0] | {"name": f"{shop}.orders", "action": "full_reload", "reason": "no state"}
    ]


def test_a_failed_ping_says_why(db_project, shop):
    from replicator.postgres.pgcluster import free_port

    done = db_project.run_process(
        "check",
        "--ping",
        env={
            "REPLICATOR_WEBHOOK_URL": f"http://127.0.0.1:{free_port()}/hook",
            "REPLICATOR_SPARK_MIN_ROWS": "0",
        },
    )
    assert done.returncode == 1
    assert re.search(
        r"error webhook: test payload not delivered: webhook to http://127\.0\.0\.1:\d+ failed "
        r"after retries: ConnectionError",
        done.stdout,
    ), done.stdout


def test_interval_without_follow_is_a_usage_error(db_project, shop):
    result = db_project.run("sync", "--interval", "1")
    assert result.exit_code == 2
    assert "--interval goes with --follow" in result.stderr
