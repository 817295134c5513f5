"""SIGTERM (systemd, Kubernetes, `timeout`), Ctrl-C and a closed terminal (SIGHUP) during a
sync: the running source query is cancelled, what the run created is dropped, the table's
state and the webhook say `interrupted`, the exit code is 143, 130 or 129, and nothing else
is printed. A signal the command was started ignoring (`nohup`) does not stop it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest
from dbcompare import leftovers
from engines import IN_PROCESS
from following import Follow
from psycopg import sql
from waiting import wait_for

from replicator.base.identifiers import TableName

pytestmark = pytest.mark.spark

# The model sleeps once before its first row: the source query is "slow".
SLOW_MODEL = "SELECT t.id, t.v FROM {{ source }} AS t CROSS JOIN (SELECT pg_sleep(120)) AS slow"


@pytest.fixture
def table(source_conn, schema):
    source_conn.execute(
        sql.SQL("CREATE TABLE {} (id int PRIMARY KEY, v text)").format(sql.Identifier(schema, "t"))
    )
    source_conn.execute(
        sql.SQL("INSERT INTO {} SELECT g, 'v' FROM generate_series(1, 500) g").format(
            sql.Identifier(schema, "t")
        )
    )
    return schema


def _sleeping(source_conn, schema: str) -> list[tuple]:
    """The source sessions running the slow model for this test."""
    return source_conn.execute(
        "SELECT pid, application_name FROM pg_stat_activity WHERE state = 'active' "
        "AND query LIKE %s AND query LIKE '%%pg_sleep(120)%%' AND pid <> pg_backend_pid()",
        (f"%{schema}%",),
    ).fetchall()


def _survivors(group: int) -> list[str]:
    """Live processes of the process group `group` (a run started as its own session), so a
    JVM or a Spark Python worker that outlived the command shows."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:  # it ended meanwhile
            continue
        name_end = text.rindex(")")
        state, _, pgrp = text[name_end + 2 :].split()[:3]
        if int(pgrp) == group and state != "Z":
            found.append(text[: name_end + 1])
    return found


class _Run:
    """`replicator ...` as its own process group, its output in files: a pipe would make
    reading it wait for whatever else holds the pipe open (a JVM outliving the command)."""

    def __init__(
        self, db_project, tmp_path: Path, *args: str, env: dict[str, str], ignoring: tuple = ()
    ) -> None:
        self.out, self.err = tmp_path / "stdout", tmp_path / "stderr"
        with self.out.open("w") as out, self.err.open("w") as err:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "replicator", *args, "--project-dir", str(db_project.path)],
                env={**os.environ, **db_project.env, **env},
                stdout=out,
                stderr=err,
                stdin=subprocess.DEVNULL,
                text=True,
                start_new_session=True,  # its own process group: what it leaves is visible
                preexec_fn=lambda: [signal.signal(s, signal.SIG_IGN) for s in ignoring],
            )

    def wait(self, timeout: float) -> tuple[int, str, str]:
        """Exit code, stdout and stderr once the command exits (and only it)."""
        try:
            code = self.process.wait(timeout=timeout)
        finally:
            self.process.kill()
        return code, self.out.read_text(), self.err.read_text()


def test_no_process_of_a_finished_run_outlives_it(db_project, table, tmp_path):
    db_project.write_config({"tables": [{"name": f"{table}.t", "mode": "full-refresh"}]})
    run = _Run(db_project, tmp_path, "sync", env={"REPLICATOR_SPARK_MIN_ROWS": "0"})
    code, _, stderr = run.wait(300)
    survivors = _survivors(run.process.pid)
    assert code == 0, stderr
    assert "t: full_reload, 500 rows" in stderr  # through Spark: a JVM ran
    assert survivors == []


@pytest.mark.parametrize(
    ("signum", "code", "env"),
    [
        pytest.param(signal.SIGTERM, 143, IN_PROCESS, id="term"),
        pytest.param(signal.SIGINT, 130, IN_PROCESS, id="int"),
        pytest.param(signal.SIGHUP, 129, IN_PROCESS, id="hup"),
        pytest.param(signal.SIGTERM, 143, {"REPLICATOR_SPARK_MIN_ROWS": "0"}, id="term-spark"),
    ],
)
def test_a_signal_mid_load_cancels_cleans_up_and_reports(
    db_project, table, source_conn, dest_conn, httpserver, signum, code, env, tmp_path
):
    httpserver.expect_request("/hook", method="POST").respond_with_data("ok")
    db_project.env["REPLICATOR_WEBHOOK_URL"] = httpserver.url_for("/hook")
    db_project.write_config({"tables": [{"name": f"{table}.t", "mode": "full-refresh"}]})
    assert db_project.run("sync", env=IN_PROCESS).exit_code == 0  # the table to replace
    (before,) = dest_conn.execute(
        sql.SQL("SELECT {}::regclass::oid").format(
            sql.Literal(sql.Identifier(table, "t").as_string(dest_conn))
        )
    ).fetchone()
    db_project.write(f"models/{table}/t.sql", SLOW_MODEL)
    run = _Run(db_project, tmp_path, "sync", env=env)
    try:
        wait_for(lambda: _sleeping(source_conn, table), 120, "the slow source query")
        os.kill(run.process.pid, signum)
    finally:
        returncode, stdout, stderr = run.wait(60)
    survivors = _survivors(run.process.pid)
    assert returncode == code, stderr
    assert survivors == []  # the JVM and Spark's Python workers too
    assert f"run interrupted by {signal.Signals(signum).name}" in stderr
    for noise in ("Traceback", "error ignored", "Aborted", "Exception"):
        assert noise not in stderr + stdout, stderr
    wait_for(lambda: not _sleeping(source_conn, table), 20, "the source query to end")
    assert leftovers(dest_conn, [TableName(table, "t")]) == [], stderr
    (after,) = dest_conn.execute(
        sql.SQL("SELECT {}::regclass::oid").format(
            sql.Literal(sql.Identifier(table, "t").as_string(dest_conn))
        )
    ).fetchone()
    assert after == before, "the live table was not touched"
    state = json.loads(db_project.run("state", "show").stdout)[f"{table}.t"]
    assert state["last_run"]["status"] == "failure"
    assert state["last_run"]["error"].startswith(
        f"interrupted by {signal.Signals(signum).name} before it finished"
    )
    payloads = [json.loads(request.get_data()) for request, _ in httpserver.log]
    assert payloads[-1]["status"] == "interrupted"
    assert payloads[-1]["tables"][0]["status"] == "failure"


@pytest.mark.parametrize("signum", [signal.SIGHUP, signal.SIGINT], ids=["nohup", "background"])
def test_a_signal_the_command_was_started_ignoring_does_not_stop_it(
    cdc_project, table, source_conn, dest_conn, tmp_path, signum
):
    """`nohup replicator sync` ignores SIGHUP, a shell script's `replicator sync &` SIGINT:
    the user asked the run to outlive them, so it goes on to the end."""
    target = sql.Identifier(table, "t")
    cdc_project.write_config({"tables": [{"name": f"{table}.t", "mode": "cdc"}]})
    assert cdc_project.run("sync", env=IN_PROCESS).exit_code == 0
    source_conn.execute(
        sql.SQL("INSERT INTO {} SELECT g, 'new' FROM generate_series(501, 600) g").format(target)
    )
    pause = tmp_path / "pause"
    env = {**IN_PROCESS, "REPLICATOR_PAUSE_AT": f"cdc-before-drain={pause}"}
    run = _Run(cdc_project, tmp_path, "sync", env=env, ignoring=(signum,))
    try:
        wait_for(lambda: Path(f"{pause}.reached").exists(), 120, "the run at its drain")
        os.kill(run.process.pid, signum)
        pause.touch()
    finally:
        returncode, _, stderr = run.wait(120)
    assert returncode == 0, stderr
    assert "interrupted" not in stderr, stderr
    counted = sql.SQL("SELECT count(*) FROM {}").format(target)
    assert dest_conn.execute(counted).fetchone() == (600,)


def test_ctrl_c_in_other_commands_exits_130_without_aborted(db_project, table, source_conn):
    """A command waiting on the database (here `status` behind a locked table) stops
    cleanly with 130, not click's `Aborted!` and exit 1."""
    db_project.write_config({"tables": [{"name": f"{table}.t", "mode": "full-refresh"}]})
    db_project.write(f"models/{table}/t.sql", "SELECT id, v FROM {{ source }}")
    with source_lock(db_project, table) as lock:
        process = subprocess.Popen(
            [sys.executable, "-m", "replicator", "status", "--project-dir", str(db_project.path)],
            env={**os.environ, **db_project.env},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            stdin=subprocess.DEVNULL,
            text=True,
        )
        # asked outside the lock's transaction, which sees pg_stat_activity as it first was
        wait_for(
            lambda: source_conn.execute(
                "SELECT EXISTS (SELECT FROM pg_stat_activity "
                "WHERE %s = ANY(pg_blocking_pids(pid)))",
                (lock.conn.info.backend_pid,),
            ).fetchone()[0],
            120,
            "status waiting on the locked table",
        )
        os.kill(process.pid, signal.SIGINT)
        _, stderr = process.communicate(timeout=30)
    assert process.returncode == 130, stderr
    assert "interrupted by SIGINT" in stderr
    assert "Aborted" not in stderr and "Traceback" not in stderr


class source_lock:
    """An ACCESS EXCLUSIVE lock on the source table, held by another session."""

    def __init__(self, project, schema: str) -> None:
        import psycopg

        self.conn = psycopg.connect(project.env["REPLICATOR_SOURCE_URL"])
        self.schema = schema

    def __enter__(self):
        self.conn.execute(
            sql.SQL("LOCK TABLE {} IN ACCESS EXCLUSIVE MODE").format(
                sql.Identifier(self.schema, "t")
            )
        )
        return self

    def __exit__(self, *exc):
        self.conn.rollback()
        self.conn.close()


def test_sigterm_during_verify_cancels_and_stops_the_run(db_project, table, source_conn):
    """The slow source query is cancelled, the run stops (the next table is not started),
    and the exit code says SIGTERM."""
    source_conn.execute(
        sql.SQL("CREATE TABLE {} (id int PRIMARY KEY)").format(sql.Identifier(table, "u"))
    )
    db_project.write_config(
        {
            "tables": [
                {"name": f"{table}.t", "mode": "full-refresh"},
                {"name": f"{table}.u", "mode": "full-refresh"},
            ]
        }
    )
    assert db_project.run("sync").exit_code == 0
    db_project.write(f"models/{table}/t.sql", SLOW_MODEL)
    process = subprocess.Popen(
        [sys.executable, "-m", "replicator", "verify", "--project-dir", str(db_project.path)],
        env={**os.environ, **db_project.env, **IN_PROCESS},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        text=True,
    )
    wait_for(lambda: _sleeping(source_conn, table), 30, "the slow verify query")
    os.kill(process.pid, signal.SIGTERM)
    _, stderr = process.communicate(timeout=30)
    assert process.returncode == 143, stderr
    assert "interrupted by SIGTERM" in stderr
    assert f"{table}.u: verifying" not in stderr, "the run stopped at the signal"
    wait_for(lambda: not _sleeping(source_conn, table), 10, "the query to be cancelled")


def test_a_signal_in_the_logs_drain_says_the_table_stopped_and_keeps_what_was_applied(
    cdc_project, table, source_conn, dest_conn, tmp_path
):
    """The drain applied a first batch (one transaction past a first batch's size), and
    the second waits on a row the test holds in the copy: SIGINT then stops a table that
    had started (not "not started"), the first batch stays, and the next run applies the
    rest."""
    target = sql.Identifier(table, "t")
    cdc_project.write_config({"tables": [{"name": f"{table}.t", "mode": "cdc"}]})
    assert cdc_project.run("sync", env=IN_PROCESS).exit_code == 0
    source_conn.execute(
        sql.SQL("INSERT INTO {} SELECT g, 'new' FROM generate_series(1001, 14000) g").format(target)
    )
    source_conn.execute(sql.SQL("UPDATE {} SET v = 'late' WHERE id = 7").format(target))
    with psycopg.connect(dest_conn.info.dsn) as holder:
        holder.execute(sql.SQL("SELECT FROM {} WHERE id = 7 FOR UPDATE").format(target))
        run = _Run(cdc_project, tmp_path, "sync", env=IN_PROCESS)
        try:
            wait_for(
                lambda: dest_conn.execute(
                    "SELECT EXISTS (SELECT FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                    "AND query LIKE %s)",
                    (f"UPDATE %{table}%",),
                ).fetchone()[0],
                120,
                "the second batch's apply waiting on the held row",
            )
            os.kill(run.process.pid, signal.SIGINT)
        finally:
            returncode, _, stderr = run.wait(60)
        holder.rollback()
    assert returncode == 130, stderr
    assert f"run interrupted by SIGINT: 0 of 1 table(s) finished, {table}.t stopped;" in stderr
    assert "not started" not in stderr, stderr
    (status, reason) = dest_conn.execute(
        "SELECT status, reason FROM _replicator.runs WHERE table_name = %s "
        "ORDER BY finished_at DESC LIMIT 1",
        (f"{table}.t",),
    ).fetchone()
    assert status == "interrupted", (status, reason)
    assert reason.startswith("stopped in the log's drain: the run was interrupted by SIGINT")
    counted = sql.SQL("SELECT count(*), count(*) FILTER (WHERE v = 'late') FROM {}")
    assert dest_conn.execute(counted.format(target)).fetchone() == (13500, 0)
    assert cdc_project.run("sync", env=IN_PROCESS).exit_code == 0
    assert dest_conn.execute(counted.format(target)).fetchone() == (13500, 1)


def test_a_hangup_stops_follow_as_sigterm_does(db_project, table):
    """`sync --follow` in a terminal that closes: SIGHUP lets the current table finish and
    the process ends with 0, as SIGTERM does (it used to die at once)."""
    db_project.write_config({"tables": [{"name": f"{table}.t", "mode": "full-refresh"}]})
    follow = Follow(db_project, IN_PROCESS)
    try:
        wait_for(follow.runs_finished, 120, "a first run")
    finally:
        code, stderr = follow.stop(signal.SIGHUP)
    assert code == 0, stderr[-3000:]
    assert "follow: stopped by a signal after" in stderr, stderr[-3000:]


def test_a_follow_run_cut_short_names_the_tables_it_skipped(
    cdc_project, table, source_conn, httpserver
):
    """SIGTERM while `sync --follow` syncs the first of three tables: that one finishes, the
    run says it was cut short and names the two it skipped (a `cdc` table among them), in
    the log and the webhook (it said `success`, `1 of 1 table(s) ok`), and exits 0."""
    httpserver.expect_request("/hook", method="POST").respond_with_data("ok")
    source_conn.execute(
        sql.SQL("CREATE TABLE {} (id int PRIMARY KEY)").format(sql.Identifier(table, "u"))
    )
    source_conn.execute(
        sql.SQL("CREATE TABLE {} (id int PRIMARY KEY)").format(sql.Identifier(table, "c"))
    )
    cdc_project.write_config(
        {
            "tables": [
                {"name": f"{table}.t", "mode": "full-refresh"},
                {"name": f"{table}.u", "mode": "full-refresh"},
                {"name": f"{table}.c", "mode": "cdc"},
            ],
            "webhook": {"url": httpserver.url_for("/hook"), "summary_interval": 3600},
        }
    )
    assert cdc_project.run("sync", env=IN_PROCESS).exit_code == 0
    slow = "SELECT t.* FROM {{ source }} AS t CROSS JOIN (SELECT pg_sleep(2)) AS slow"
    cdc_project.write(f"models/{table}/t.sql", slow)
    follow = Follow(cdc_project, IN_PROCESS)
    try:
        wait_for(
            lambda: source_conn.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE query LIKE %s AND pid <> "
                "pg_backend_pid()",
                ("%pg_sleep(2)%",),
            ).fetchone()[0],
            120,
            "the first table's read",
        )
    finally:
        code, stderr = follow.stop(signal.SIGTERM)
    assert code == 0, stderr[-3000:]
    assert (
        f"cut short by SIGTERM (`sync --follow` stopping), 2 of 3 table(s) skipped: 2 tables: "
        f"{table}.u, {table}.c" in stderr
    ), stderr[-3000:]
    last = json.loads(httpserver.log[-1][0].get_data())
    assert last["status"] == "interrupted", last
    assert last["skipped"] == [f"{table}.u", f"{table}.c"]
    assert "1 of 3 table(s) ok, 2 skipped" in last["text"], last["text"]
