"""Running unattended: what a TTY and a pipe show, Spark master checks, and no secret anywhere."""

from __future__ import annotations

import json
import os
import re
import shlex
import socket
import subprocess
import sys
from typing import Any

import psycopg
import pytest
from engines import IN_PROCESS
from psycopg import sql
from waiting import wait_for

from replicator.postgres.pgcluster import free_port
from replicator.report import webhook

pytestmark = pytest.mark.spark

SOURCE_PASSWORD = "src-Pa55-word-7f3a"
DEST_PASSWORD = "dst-Pa55-word-91c2"
PGPASSWORD = "env-Pa55-word-44d1"
WEBHOOK_SECRET = "hook-secret-0b7e"
WEBHOOK_TOKEN = "T0KEN-in-path-5e8d"
SECRETS = (SOURCE_PASSWORD, DEST_PASSWORD, PGPASSWORD, WEBHOOK_SECRET, WEBHOOK_TOKEN)


@pytest.fixture
def tables(source_conn, schema):
    for name in ("good", "boom"):
        source_conn.execute(
            sql.SQL(
                "CREATE TABLE {} (id int PRIMARY KEY, v text, "
                "updated_at timestamptz NOT NULL DEFAULT now())"
            ).format(sql.Identifier(schema, name))
        )
        source_conn.execute(
            sql.SQL("INSERT INTO {} (id, v) SELECT g, 'v' FROM generate_series(1, 20) g").format(
                sql.Identifier(schema, name)
            )
        )
    return schema


def _with_password(url: str, password: str) -> str:
    return url.replace("postgres@", f"postgres:{password}@", 1)


def _key_value(url: str, password: str) -> str:
    port = re.search(r":(\d+)/", url).group(1)
    return f"host=127.0.0.1 port={port} user=postgres password={password} dbname=postgres"


def _tty_run(project, *args: str) -> str:
    """The command under `script`, so its stdout is a terminal; the typescript returned."""
    command = shlex.join(
        [sys.executable, "-m", "replicator", *args, "--project-dir", str(project.path)]
    )
    env = {**os.environ, **project.env, "COLUMNS": "160"}
    done = subprocess.run(
        ["script", "-q", "-e", "-c", command, "/dev/null"],
        env=env,
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
        timeout=300,
    )
    return done.stdout


def test_a_tty_gets_progress_and_a_summary_table_a_pipe_only_log_lines(db_project, tables):
    db_project.write_config(
        {"tables": [{"name": f"{tables}.good", "replication_key": "updated_at"}]}
    )
    typescript = _tty_run(db_project, "sync")
    assert "partitions" in typescript, "the progress bar of copied partitions"
    assert "sync: 1 succeeded, 0 failed" in typescript
    assert "reason or error" in typescript
    piped = db_project.run_process("sync", "-f", env=IN_PROCESS)  # the engine adds nothing
    assert piped.returncode == 0
    assert piped.stdout == ""
    lines = piped.stderr.splitlines()
    assert lines, "one log line per table, plus the run's start and end"
    stamp = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d")
    assert all(stamp.match(line) for line in lines), lines
    assert any(f"{tables}.good: full_reload, 20 rows" in line for line in lines)


# Each row (16 kB: the copy streams MiB blocks) waits 6 ms in the source, so a 400-row copy
# takes at least 2.4 s however fast the machine: many progress intervals (0.2 s here) and
# polls (0.5 s).
SLOW_MODEL = (
    "SELECT t.id, t.v, t.updated_at FROM {{ source }} AS t WHERE pg_sleep(0.006)::text = ''"
)
PROGRESS_LINE = re.compile(
    r"(?P<table>\S+): copying: (?P<rows>[\d,]+) of ~(?P<estimate>[\d,]+) rows, [\d,.]+ MB, "
    r"[\d,]+ rows/s(, ETA \d+:\d\d:\d\d)?, partitions (?P<done>\d+)/(?P<parts>\d+)"
)


@pytest.fixture
def slow(db_project, source_conn, schema):
    table = sql.Identifier(schema, "slow")
    source_conn.execute(
        sql.SQL(
            "CREATE TABLE {} (id int PRIMARY KEY, v text, "
            "updated_at timestamptz NOT NULL DEFAULT now())"
        ).format(table)
    )
    source_conn.execute(
        sql.SQL(
            "INSERT INTO {} (id, v) SELECT g, repeat('v', 16000) FROM generate_series(1, 400) g"
        ).format(table)
    )
    source_conn.execute(sql.SQL("ANALYZE {}").format(table))
    db_project.write(f"models/{schema}/slow.sql", SLOW_MODEL)
    db_project.write_config({"tables": [{"name": f"{schema}.slow", "mode": "full-refresh"}]})
    return schema


@pytest.mark.parametrize("min_rows", ["0", "1000000000"], ids=["spark", "in-process"])
def test_a_long_copy_logs_its_progress_off_a_terminal(db_project, slow, min_rows):
    done = db_project.run_process(
        "sync",
        env={"REPLICATOR_PROGRESS_INTERVAL": "0.2", "REPLICATOR_SPARK_MIN_ROWS": min_rows},
    )
    assert done.returncode == 0, done.stderr
    lines = [m for m in map(PROGRESS_LINE.search, done.stderr.splitlines()) if m]
    assert len(lines) >= 2, done.stderr
    rows = [int(m["rows"].replace(",", "")) for m in lines]
    assert rows == sorted(rows) and rows[-1] > 0, rows
    assert {m["estimate"] for m in lines} == {"400"}, "the planner's estimate"
    assert all(m["table"] == f"{slow}.slow" and m["parts"] == "1" for m in lines)
    quiet = db_project.run_process(
        "sync",
        "-q",
        env={"REPLICATOR_PROGRESS_INTERVAL": "0.2", "REPLICATOR_SPARK_MIN_ROWS": min_rows},
    )
    assert quiet.returncode == 0 and quiet.stderr == "", quiet.stderr


def test_a_slow_step_before_the_copy_is_logged_with_its_name(db_project, source_conn, schema):
    """The first cursor is read through the model before anything is copied: a model that
    takes seconds says so while it runs, not only when the copy starts."""
    table = sql.Identifier(schema, "t")
    source_conn.execute(
        sql.SQL("CREATE TABLE {} (id int PRIMARY KEY, updated_at timestamptz NOT NULL)").format(
            table
        )
    )
    source_conn.execute(
        sql.SQL("INSERT INTO {} SELECT g, now() FROM generate_series(1, 9) g").format(table)
    )
    db_project.write(
        f"models/{schema}/t.sql",
        "SELECT t.* FROM {{ source }} AS t CROSS JOIN (SELECT pg_sleep(2.5)) AS slow",
    )
    db_project.write_config({"tables": [{"name": f"{schema}.t", "replication_key": "updated_at"}]})
    done = db_project.run_process(
        "sync", env={"REPLICATOR_PROGRESS_INTERVAL": "1", "REPLICATOR_SPARK_MIN_ROWS": "1000000"}
    )
    assert done.returncode == 0, done.stderr
    assert re.search(
        rf"{schema}\.t: reading the first cursor from the model, in the load's snapshot, \d+ s "
        r"so far",
        done.stderr,
    ), done.stderr


def test_a_terminal_gets_a_live_progress_line_but_not_under_q(db_project, slow):
    typescript = _tty_run(db_project, "sync")
    assert re.search(r"[\d,]+ of ~400 rows, [\d.]+ MB, [\d,]+ rows/s", typescript), typescript
    assert "partitions 0/1" in typescript
    assert "sync: 1 succeeded, 0 failed" in typescript
    db_project.env.update(IN_PROCESS)  # a quiet Spark run: test_a_long_copy_logs_its_progress...
    quiet = _tty_run(db_project, "sync", "-q")
    assert "rows/s" not in quiet and "succeeded" not in quiet, quiet


def test_check_reports_an_unreachable_spark_master(db_project, tables):
    db_project.write_config(
        {
            "tables": [{"name": f"{tables}.good", "replication_key": "updated_at"}],
            "spark": {"master": f"spark://127.0.0.1:{free_port()}"},
        }
    )
    result = db_project.run("check")
    assert result.exit_code == 1
    assert re.search(
        r"error spark: master spark://127\.0\.0\.1:\d+: 127\.0\.0\.1:\d+ not reachable "
        r"\(Connection refused\); fix: start the master or fix spark\.master",
        result.stdout,
    ), result.stdout


def test_check_accepts_a_spark_master_that_answers(db_project, tables):
    db_project.write_config(
        {"tables": [{"name": f"{tables}.good", "replication_key": "updated_at"}]}
    )
    dead = free_port()
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        result = db_project.run(
            "check", env={"REPLICATOR_SPARK_MASTER": f"spark://127.0.0.1:{dead},127.0.0.1:{port}"}
        )
    assert (
        f"ok    spark: master spark://127.0.0.1:{dead},127.0.0.1:{port}: 127.0.0.1:{port} answers"
        in result.stdout
    )
    assert result.exit_code == 0, result.stdout


def test_no_password_or_secret_appears_in_any_output_file_or_payload(
    db_project, tables, pg_servers, httpserver, monkeypatch
):
    """Every command, verbose, through success, a failing table, a failing Spark task and an
    unreachable database: the passwords and secrets are nowhere."""
    monkeypatch.setattr(webhook, "RETRY_WAIT_SECONDS", 0.01)
    httpserver.expect_request(f"/hook/{WEBHOOK_TOKEN}", method="POST").respond_with_data("ok")
    db_project.env.update(
        REPLICATOR_SOURCE_URL=_with_password(pg_servers.source_url, SOURCE_PASSWORD),
        REPLICATOR_DEST_URL=_key_value(pg_servers.dest_url, DEST_PASSWORD),
        REPLICATOR_WEBHOOK_URL=httpserver.url_for(f"/hook/{WEBHOOK_TOKEN}"),
        REPLICATOR_WEBHOOK_SECRET=WEBHOOK_SECRET,
        PGPASSWORD=PGPASSWORD,
    )
    db_project.write_config(
        {
            "tables": [
                {"name": f"{tables}.good", "replication_key": "updated_at"},
                # Its model divides by zero on one row: the Spark task fails mid-COPY.
                {"name": f"{tables}.boom", "replication_key": "updated_at"},
                {"name": f"{tables}.missing", "replication_key": "updated_at"},
            ]
        }
    )
    db_project.write(
        f"models/{tables}/boom.sql",
        "SELECT id, (10 / (id - 7))::text AS v, updated_at FROM {{ source }}",
    )
    outputs = []
    for args, env in [
        (("sync", "-vv"), {}),
        (("sync", "-vv", "--log-format", "json"), {}),
        (("status", "--json", "-v"), {}),
        (("compile", "-v"), {}),
        (("compile", "--json"), {}),
        (("state", "show"), {}),
        (("check", "--ping", "-v"), {}),
        (
            ("sync", "-v"),
            {"REPLICATOR_DEST_URL": _key_value(f":{free_port()}/", DEST_PASSWORD)},
        ),
        (("sync", "-v", "--since", "x", "-s", "good"), {}),
        (("state", "set-cursor", f"{tables}.good", f"bad {SOURCE_PASSWORD}"), {}),
    ]:
        done = db_project.run_process(*args, env=env)
        outputs.append((args, done.returncode, done.stdout + done.stderr))
    codes = {args: code for args, code, _ in outputs}
    assert codes[("sync", "-vv")] == 1, "boom and missing fail, good succeeds"
    everything = "\n".join(text for _, _, text in outputs)
    assert "division by zero" in everything, "the Spark task's error was reported"
    assert "source table does not exist" in everything
    assert "cannot connect to the destination database" in everything
    for path in db_project.path.rglob("*"):
        if path.is_file():
            everything += path.read_bytes().decode("utf-8", errors="replace")
    for request, _ in httpserver.log:
        everything += request.get_data(as_text=True)
        everything += json.dumps({k: v for k, v in request.headers.items()})
    assert len(httpserver.log) >= 3, "sync webhooks and the --ping"
    leaked = [secret for secret in SECRETS if secret in everything]
    assert not leaked, f"leaked: {leaked}"


def test_a_cdc_load_waiting_for_an_open_source_transaction_says_so(
    cdc_project, source_conn, schema, tmp_path
):
    """A new slot and a log snapshot wait for every transaction open in the source: the
    first sync (the project's slot) and a reload of a `cdc` table behind a forgotten session
    say what they wait for (the reload said "preparing the destination", a newcomer trial),
    and go on once the transaction ends."""
    for name in ("logged", "other"):
        source_conn.execute(
            sql.SQL("CREATE TABLE {} (id int PRIMARY KEY)").format(sql.Identifier(schema, name))
        )
    cdc_project.env.update(IN_PROCESS)
    cdc_project.write_config({"tables": [{"name": f"{schema}.logged", "mode": "cdc"}]})
    said = (
        # the project's slot, at the first sync: what it waits for, by pid
        "still waiting after 0 s for the transaction(s) open in the source: pid ",
        "waiting for the source's open transactions (a log snapshot waits)",  # the reload
    )
    cli = [sys.executable, "-m", "replicator"]
    for n, (args, waits_for) in enumerate(zip((["sync"], ["sync", "-f"]), said, strict=True)):
        log = tmp_path / f"stderr{n}"
        with psycopg.connect(source_conn.info.dsn) as open_one, log.open("w") as err:
            open_one.execute(
                sql.SQL("INSERT INTO {} VALUES (%s)").format(sql.Identifier(schema, "other")),
                (n,),
            )
            run = subprocess.Popen(
                [*cli, *args, "--project-dir", str(cdc_project.path)],
                env={**os.environ, **cdc_project.env, "REPLICATOR_PROGRESS_INTERVAL": "0.2"},
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=err,
            )
            wait_for(
                lambda w=waits_for, f=log: w in f.read_text(), 120, f"the run saying {waits_for}"
            )
            open_one.commit()
            assert run.wait(timeout=120) == 0, log.read_text()
    assert f"{schema}.logged: full_reload" in log.read_text()


@pytest.fixture
def own_destination():
    """A destination server of the test's own, to restart."""
    import shutil
    import tempfile
    from pathlib import Path

    from replicator.postgres.pgcluster import PgCluster

    base = Path(tempfile.mkdtemp(prefix="replicator-test-pg-"))
    cluster = PgCluster(base / "dest")
    try:
        yield cluster.start()
    finally:
        cluster.destroy()
        shutil.rmtree(base, ignore_errors=True)


def test_a_destination_restarted_mid_run_costs_only_the_table_it_was_writing(
    db_project, source_conn, schema, own_destination
):
    """The destination restarts while the first of two tables is read: that table fails,
    the run connects again and the second is copied (it failed with `the connection is
    closed`); what the run says counts the table that failed."""
    for name in ("a", "b"):
        table = sql.Identifier(schema, name)
        source_conn.execute(sql.SQL("CREATE TABLE {} (id int PRIMARY KEY)").format(table))
        source_conn.execute(sql.SQL("INSERT INTO {} SELECT generate_series(1, 50)").format(table))
    db_project.env.update(IN_PROCESS, REPLICATOR_DEST_URL=own_destination.url())
    db_project.write_config(
        {"tables": [{"name": f"{schema}.{n}", "mode": "full-refresh"} for n in ("a", "b")]}
    )
    slow = "SELECT t.* FROM {{ source }} AS t CROSS JOIN (SELECT pg_sleep(120)) AS s"
    db_project.write(f"models/{schema}/a.sql", slow)

    def run_while(outage: Any) -> tuple[int, str]:
        """A sync, and the outage while it reads table a (then a's read is cancelled)."""
        run = subprocess.Popen(
            [sys.executable, "-m", "replicator", "sync", "--project-dir", str(db_project.path)],
            env={**os.environ, **db_project.env},
            stdin=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            sleeping = (
                "SELECT pid FROM pg_stat_activity WHERE query LIKE '%%pg_sleep(120)%%' "
                "AND pid <> pg_backend_pid()"
            )
            wait_for(lambda: source_conn.execute(sleeping).fetchall(), 120, "table a's read")
            outage()
            source_conn.execute(f"SELECT pg_cancel_backend(pid) FROM ({sleeping}) AS s")
            _, stderr = run.communicate(timeout=120)
        finally:
            run.kill()
        return run.returncode, stderr

    code, stderr = run_while(own_destination.restart)
    assert code == 1, stderr
    assert f"{schema}.a: failed after" in stderr
    assert "destination: the connection was lost; connecting again" in stderr
    assert f"{schema}.b: full_reload, 50 rows" in stderr, stderr
    assert "sync finished: 1 succeeded, 1 failed" in stderr
    with psycopg.connect(own_destination.url()) as dest:
        copied = dest.execute(
            sql.SQL("SELECT count(*) FROM {}").format(sql.Identifier(schema, "b"))
        )
        assert copied.fetchone() == (50,)
