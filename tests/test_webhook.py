"""The webhook after every sync: payload, signature, retries, and never a changed exit code."""

from __future__ import annotations

import hashlib
import hmac
import json
import signal
import subprocess
import sys

import pytest
from psycopg import sql

from replicator.postgres.pgcluster import free_port
from replicator.report import webhook

SECRET = "s3cret-webhook-key"


@pytest.fixture(autouse=True)
def _fast_retries(monkeypatch):
    monkeypatch.setattr(webhook, "RETRY_WAIT_SECONDS", 0.01)


@pytest.fixture
def table(source_conn, schema):
    source_conn.execute(
        sql.SQL("CREATE TABLE {} (id int PRIMARY KEY, v text)").format(sql.Identifier(schema, "t"))
    )
    source_conn.execute(
        sql.SQL("INSERT INTO {} VALUES (1, 'a'), (2, 'b')").format(sql.Identifier(schema, "t"))
    )
    return f"{schema}.t"


def _configure(project, url, tables, secret=SECRET):
    project.write_config(
        {
            "tables": [{"name": t, "mode": "full-refresh"} for t in tables],
            "webhook": {"url": url, "secret": secret},
        }
    )


def verify_signature(body: bytes, header: str, secret: str) -> bool:
    """The recipe the README documents for receivers."""
    expected = "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()
    return hmac.compare_digest(expected, header)


def test_success_payload_is_signed(db_project, table, httpserver):
    httpserver.expect_request("/hook", method="POST").respond_with_data("ok")
    _configure(db_project, httpserver.url_for("/hook"), [table])
    result = db_project.run("sync")
    assert result.exit_code == 0, result.output
    ((request, _),) = httpserver.log
    payload = json.loads(request.data)
    assert payload["event"] == "sync.finished" and payload["status"] == "success"
    assert payload["run_id"] and payload["started_at"] <= payload["finished_at"]
    (entry,) = payload["tables"]
    assert entry | {"duration_seconds": 0} == {
        "name": table,
        "status": "success",
        "action": "full_reload",
        "rows": 2,
        "reason": "mode full-refresh",
        "error": None,
        "duration_seconds": 0,
        "cursor_from": None,
        "cursor_to": None,
        "deleted": 0,
    }
    assert payload["text"].startswith("replicator sync success: 1 of 1 table(s) ok")
    assert request.headers["Content-Type"] == "application/json"
    assert request.headers["User-Agent"].startswith("replicator/")
    header = request.headers["X-Replicator-Signature"]
    assert verify_signature(request.data, header, SECRET)
    tampered = bytearray(request.data)
    tampered[5] ^= 1
    assert not verify_signature(bytes(tampered), header, SECRET)
    assert SECRET not in request.data.decode() and SECRET not in result.output


def test_partial_failure_names_the_failed_table(db_project, table, schema, httpserver):
    httpserver.expect_request("/hook").respond_with_data("ok")
    _configure(db_project, httpserver.url_for("/hook"), [f"{schema}.missing", table])
    assert db_project.run("sync").exit_code == 1
    payload = json.loads(httpserver.log[0][0].data)
    assert payload["status"] == "failure"
    assert [(t["name"], t["status"]) for t in payload["tables"]] == [
        (f"{schema}.missing", "failure"),
        (table, "success"),
    ]
    assert payload["tables"][0]["error"] == (
        f"{schema}.missing: source table does not exist: create it, or fix its name "
        "(tables[0] in tables-config.json)"
    )
    assert f"failed: {schema}.missing" in payload["text"]


def test_total_failure_is_reported_too(db_project, table, httpserver):
    httpserver.expect_request("/hook").respond_with_data("ok")
    _configure(db_project, httpserver.url_for("/hook"), [table])
    bad = f"postgresql://postgres:pw-not-to-leak@127.0.0.1:{free_port()}/postgres"
    result = db_project.run("sync", env={"REPLICATOR_SOURCE_URL": bad})
    assert result.exit_code == 1
    payload = json.loads(httpserver.log[0][0].data)
    assert payload["status"] == "failure"
    assert payload["tables"][0]["error"].startswith("cannot connect to the source database")
    assert "pw-not-to-leak" not in httpserver.log[0][0].data.decode()


def test_5xx_answers_are_retried(db_project, table, httpserver):
    for status in (500, 503):
        httpserver.expect_ordered_request("/hook").respond_with_data("busy", status=status)
    httpserver.expect_ordered_request("/hook").respond_with_data("ok")
    _configure(db_project, httpserver.url_for("/hook"), [table])
    result = db_project.run("sync")
    assert result.exit_code == 0
    assert len(httpserver.log) == 3
    assert "webhook delivered to http://localhost" in result.stderr


def test_unreachable_webhook_never_changes_the_exit_code(db_project, table):
    port = free_port()
    _configure(db_project, f"http://127.0.0.1:{port}/secret-token-path", [table])
    result = db_project.run("sync")
    assert result.exit_code == 0
    assert f"webhook to http://127.0.0.1:{port} failed after retries" in result.stderr
    assert "secret-token-path" not in result.stderr


@pytest.mark.parametrize(
    ("url", "problem"),
    [
        ("http://127.0.0.1:99999/secret-token-path", "is not a valid URL: Port out of range"),
        ("http://[bad/secret-token-path", "is not a valid URL: its host part cannot be read"),
        ("https:///secret-token-path", "must be an http:// or https:// URL with a host"),
        (
            "http://user:pa\uff03ss@h/secret-token-path",
            "is not a valid URL: its host part cannot be read",
        ),
    ],
)
def test_a_webhook_url_that_could_never_be_sent_to_is_exit_2_before_anything(
    db_project, table, url, problem
):
    """Found when the settings are read, not after the tables synced (it was an internal
    error then, exit 1), from the config or the environment; the path stays unsaid."""
    _configure(db_project, url, [table])
    before = db_project.files()
    from_config = db_project.run("sync")
    assert from_config.exit_code == 2, from_config.output
    assert f"tables-config.json webhook.url {problem}" in from_config.stderr
    from_env = db_project.run("sync", env={"REPLICATOR_WEBHOOK_URL": url})
    assert from_env.exit_code == 2, from_env.output
    assert f"REPLICATOR_WEBHOOK_URL {problem}" in from_env.stderr
    assert "secret-token-path" not in from_config.output + from_env.output
    assert "pa\uff03ss" not in from_config.output + from_env.output
    assert db_project.files() == before


def test_lock_held_run_reports_skipped(db_project, table, httpserver):
    httpserver.expect_request("/hook").respond_with_data("ok")
    _configure(db_project, httpserver.url_for("/hook"), [table])
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time; from pathlib import Path; "
            "from replicator.project.runlock import run_lock\n"
            "with run_lock(Path(sys.argv[1])):\n print('held', flush=True); time.sleep(60)",
            str(db_project.path / "sync-state"),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        result = db_project.run("sync")
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    assert result.exit_code == 75
    payload = json.loads(httpserver.log[0][0].data)
    assert payload["status"] == "skipped" and payload["tables"] == []
    assert "holds the lock" in payload["error"]


def test_config_errors_send_nothing(project, httpserver):
    project.write_config(
        {
            "tables": [{"name": "a.b", "mode": "full-refresh", "bogus": 1}],
            "webhook": {"url": httpserver.url_for("/hook")},
        }
    )
    assert project.run("sync").exit_code == 2
    assert httpserver.log == []


def test_json_log_lines_carry_run_and_table_events(db_project, table):
    db_project.write_config({"tables": [{"name": table, "mode": "full-refresh"}]})
    result = db_project.run("sync", "--log-format", "json")
    assert result.exit_code == 0, result.output
    events = [json.loads(line) for line in result.stderr.splitlines() if line.strip()]
    kinds = [e.get("event") for e in events if "event" in e]
    assert kinds[0] == "run.started" and kinds[-1] == "run.finished"
    finished = next(e for e in events if e.get("event") == "table.finished")
    assert finished["name"] == table and finished["rows"] == 2
    assert finished["action"] == "full_reload" and finished["status"] == "success"
    assert all(e["level"] in ("info", "debug", "warning", "error") for e in events)
