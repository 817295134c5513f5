"""Hostile passwords in connection settings: refused up front when libpq would misread them,
read exactly as written otherwise (no `${VAR}` expansion), and never printed."""

from __future__ import annotations

import re
from urllib.parse import quote

import pytest
from engines import IN_PROCESS
from psycopg import sql

from replicator.project.settings import Environment

pytestmark = pytest.mark.spark


@pytest.fixture
def table(source_conn, schema):
    source_conn.execute(
        sql.SQL(
            "CREATE TABLE {} (id int PRIMARY KEY, updated_at timestamptz NOT NULL DEFAULT now())"
        ).format(sql.Identifier(schema, "t"))
    )
    source_conn.execute(
        sql.SQL("INSERT INTO {} (id) SELECT generate_series(1, 10)").format(
            sql.Identifier(schema, "t")
        )
    )
    return f"{schema}.t"


def _port(url: str) -> str:
    return re.search(r":(\d+)/", url).group(1)


def _fragments(password: str) -> list[str]:
    """Pieces of the password a cut at `@` or `/` would print on their own."""
    return [password, *(p for p in re.split(r"[@/]", password) if len(p) >= 3)]


COMMANDS = [
    ("sync",),
    ("sync", "-f", "-v"),
    ("sync", "--log-format", "json"),
    ("check", "-v"),
    ("compile",),
    ("compile", "--json"),
    ("status",),
    ("status", "--json"),
    ("sync", "-s", "t", "--since", "2020-01-01"),
    ("adopt", "t"),
]
SOURCE_ONLY = [("state", "set-cursor", "t", "2020-01-01")]


@pytest.mark.parametrize("side", ["REPLICATOR_SOURCE_URL", "REPLICATOR_DEST_URL"])
def test_a_uri_with_an_unencoded_at_sign_is_refused_by_every_command(
    db_project, table, password_role, pg_servers, side
):
    hostile = (
        f"postgresql://{password_role.name}:{password_role.password}"
        f"@127.0.0.1:{_port(pg_servers.source_url)}/postgres"
    )
    db_project.env[side] = hostile
    db_project.write_config({"tables": [{"name": table, "replication_key": "updated_at"}]})
    seen = []
    for args in COMMANDS + (SOURCE_ONLY if side == "REPLICATOR_SOURCE_URL" else []):
        done = db_project.run_process(*args)
        assert done.returncode == 2, (args, done.stderr)
        assert f"{side}: the URI has more than one '@'" in done.stderr, (args, done.stderr)
        assert "percent-encode '@' as %40" in done.stderr
        assert "Traceback" not in done.stderr
        seen.append(done.stdout + done.stderr)
    files = [p.read_text(errors="replace") for p in db_project.path.rglob("*") if p.is_file()]
    everything = "\n".join(seen + files)
    leaked = [f for f in _fragments(password_role.password) if f in everything]
    assert not leaked, leaked
    assert not list((db_project.path / "sync-state").glob("*.json")), "nothing was written"


def test_a_percent_encoded_password_authenticates_and_is_never_printed(
    db_project, table, password_role, pg_servers
):
    db_project.env["REPLICATOR_SOURCE_URL"] = (
        f"postgresql://{password_role.name}:{quote(password_role.password, safe='')}"
        f"@127.0.0.1:{_port(pg_servers.source_url)}/postgres"
    )
    db_project.write_config({"tables": [{"name": table, "replication_key": "updated_at"}]})
    synced = db_project.run_process("sync", "-vv")
    assert synced.returncode == 0, synced.stderr
    assert "full_reload, 10 rows" in synced.stderr
    outputs = [synced.stdout + synced.stderr]
    for args in (("check", "-v"), ("status", "--json"), ("compile",)):
        done = db_project.run_process(*args)
        assert done.returncode == 0, (args, done.stdout, done.stderr)
        outputs.append(done.stdout + done.stderr)
    everything = "\n".join(outputs)
    for secret in (password_role.password, quote(password_role.password, safe="")):
        assert secret not in everything


def test_dotenv_values_are_read_as_written_without_interpolation(
    db_project, table, password_role, pg_servers
):
    """A single-quoted .env value with `${HOME}` in the password: used verbatim, so the
    SCRAM login succeeds (expanded, it would fail with a wrong password)."""

    def escaped(text: str) -> str:  # libpq's and python-dotenv's rule inside '...'
        return text.replace("\\", "\\\\").replace("'", "\\'")

    conninfo = (
        f"host=127.0.0.1 port={_port(pg_servers.source_url)} dbname=postgres "
        f"user={password_role.name} password='{escaped(password_role.password)}'"
    )
    db_project.write(".env", f"REPLICATOR_SOURCE_URL='{escaped(conninfo)}'\n")
    env = Environment.load(db_project.path)
    assert "${HOME}" in env.get("REPLICATOR_SOURCE_URL")
    db_project.env.pop("REPLICATOR_SOURCE_URL")
    db_project.write_config({"tables": [{"name": table, "replication_key": "updated_at"}]})
    synced = db_project.run_process("sync", env=IN_PROCESS, drop=("REPLICATOR_SOURCE_URL",))
    assert synced.returncode == 0, synced.stderr
    assert password_role.password not in synced.stderr


def test_a_uri_libpq_cannot_decode_never_prints_its_password(db_project, table, pg_servers):
    """The README's old advice (encode `@` and `/`) left a `%` bare: libpq refused the URI
    and every command printed the whole password in libpq's error."""
    password = "p@ss:w/rd%"
    written = "p%40ss:w%2Frd%"  # `%` itself not encoded
    port = _port(pg_servers.source_url)
    db_project.env["REPLICATOR_DEST_URL"] = f"postgresql://loader:{written}@127.0.0.1:{port}/db"
    db_project.write_config({"tables": [{"name": table, "replication_key": "updated_at"}]})
    outputs = []
    for args in (("sync",), ("check", "-v"), ("status", "--json"), ("verify",)):
        done = db_project.run_process(*args)
        assert done.returncode == 2, (args, done.stderr)
        assert "percent-encode '%' itself as %25" in done.stderr, (args, done.stderr)
        outputs.append(done.stdout + done.stderr)
    everything = "\n".join(outputs)
    leaked = [f for f in (password, written, "w%2Frd%", "p%40ss") if f in everything]
    assert not leaked, (leaked, everything)
