"""Secrets never appear in what the tool prints."""

from __future__ import annotations

import pytest

from replicator.base.redact import redact, register_connection_string, register_secret


@pytest.mark.parametrize(
    ("text", "leak"),
    [
        ("postgresql://alice:s3cr3t-pw@db:5432/app", "s3cr3t-pw"),
        ("postgres://alice:p%40ss@db/app failed", "p%40ss"),
        ("host=db password=kv-secret user=alice", "kv-secret"),
        ("host=db password='quoted secret' user=alice", "quoted secret"),
        ("postgresql://db/app?password=query-secret&sslmode=require", "query-secret"),
        ("PGPASSWORD=envsecret psql", "envsecret"),
        # libpq would cut these at the first `@`; the redactor masks to the last one.
        ("postgresql://alice:p@ss-tail-7c@db:5432/app", "ss-tail-7c"),
        ("dsn postgresql://alice:pw/with@sl-ash-9@db/app rejected", "sl-ash-9"),
        ("postgresql://al@ice:at-in-user-3b@db/app", "at-in-user-3b"),
    ],
)
def test_password_shapes_are_masked(text, leak):
    out = redact(text)
    assert leak not in out
    assert "***" in out


def test_registered_secrets_are_masked_anywhere():
    register_secret("webhook-signing-key-123")
    register_connection_string("host=db user=a password=only-in-conninfo-456")
    message = "FATAL: password only-in-conninfo-456 rejected, key webhook-signing-key-123"
    out = redact(message)
    assert "only-in-conninfo-456" not in out and "webhook-signing-key-123" not in out


def test_unreachable_server_error_does_not_echo_password(db_project):
    db_project.write_config({"tables": [{"name": "public.t", "mode": "full-refresh"}]})
    url = "postgresql://postgres:very-secret-pw@127.0.0.1:1/postgres?connect_timeout=2"
    result = db_project.run("check", env={"REPLICATOR_SOURCE_URL": url})
    assert result.exit_code == 1
    assert "cannot connect to the source database" in result.output
    assert "very-secret-pw" not in result.output
