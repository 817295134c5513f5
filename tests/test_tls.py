"""A source that accepts only TLS (`hostssl`, SCRAM and a client certificate), reached with
`sslmode=verify-full` and a private CA: copies in this process and in Spark's tasks, both
checking the server's certificate; and `check` warns of a server on another host reached
without that."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psycopg
import pytest
from dbcompare import assert_same_table
from engines import IN_PROCESS
from psycopg import sql

from replicator.postgres.pgcluster import PgCluster

pytestmark = pytest.mark.spark

ROLE, PASSWORD = "tls_loader", "tls-Pa55-w0rd"


@dataclass(frozen=True)
class TlsSource:
    url: str  # over TLS, verify-full, with the client certificate
    admin: str  # the superuser over the Unix socket (the only other way in)
    plain: str  # the same role without TLS: refused


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


def _certificates(folder: Path) -> None:
    """A CA, a server certificate for localhost and 127.0.0.1, and a client certificate for
    the role, each signed by the CA."""
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-keyout",
             "ca.key", "-out", "ca.crt", "-subj", "/CN=replicator test CA", cwd=folder)  # fmt: skip
    for name, subject, extension in (
        ("server", "/CN=localhost", "subjectAltName=DNS:localhost,IP:127.0.0.1"),
        ("client", f"/CN={ROLE}", "keyUsage=digitalSignature"),
    ):
        _openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{name}.key", "-out",
                 f"{name}.csr", "-subj", subject, cwd=folder)  # fmt: skip
        (folder / f"{name}.ext").write_text(extension + "\n")
        _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
                 "-CAcreateserial", "-days", "2", "-out", f"{name}.crt", "-extfile",
                 f"{name}.ext", cwd=folder)  # fmt: skip
    (folder / "client.key").chmod(0o600)


@pytest.fixture(scope="module")
def tls_source() -> Iterator[TlsSource]:
    base = Path(tempfile.mkdtemp(prefix="replicator-test-tls-"))
    certs = base / "certs"
    certs.mkdir()
    _certificates(certs)
    cluster = PgCluster(base / "source")
    try:
        cluster.start()
        for name in ("server.crt", "server.key", "ca.crt"):
            shutil.copy(certs / name, cluster.data / name)
            shutil.chown(cluster.data / name, "postgres", "postgres")
        (cluster.data / "server.key").chmod(0o600)
        with open(cluster.data / "postgresql.conf", "a", encoding="utf-8") as conf:
            conf.write("ssl = on\nssl_cert_file = 'server.crt'\nssl_key_file = 'server.key'\n")
            conf.write("ssl_ca_file = 'ca.crt'\npassword_encryption = 'scram-sha-256'\n")
        (cluster.data / "pg_hba.conf").write_text(
            "local all all trust\n"
            "hostssl all all 127.0.0.1/32 scram-sha-256 clientcert=verify-full\n"
        )
        cluster.restart()
        admin = f"host={cluster.folder} port={cluster.port} user=postgres dbname=postgres"
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(
                sql.SQL("CREATE ROLE {} LOGIN SUPERUSER PASSWORD {}").format(
                    sql.Identifier(ROLE), sql.Literal(PASSWORD)
                )
            )
        url = (
            f"postgresql://{ROLE}:{PASSWORD}@localhost:{cluster.port}/postgres?"
            f"sslmode=verify-full&sslrootcert={certs / 'ca.crt'}&sslcert={certs / 'client.crt'}"
            f"&sslkey={certs / 'client.key'}"
        )
        plain = f"postgresql://{ROLE}:{PASSWORD}@127.0.0.1:{cluster.port}/postgres?sslmode=disable"
        yield TlsSource(url, admin, plain)
    finally:
        cluster.destroy()
        shutil.rmtree(base, ignore_errors=True)


def test_a_tls_only_source_is_copied_in_both_engines_checking_its_certificate(
    db_project, tls_source, dest_conn, schema
):
    with pytest.raises(psycopg.OperationalError, match=r"no pg_hba\.conf entry"):
        psycopg.connect(tls_source.plain).close()
    with psycopg.connect(tls_source.admin, autocommit=True) as source:
        source.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(schema)))
        for name in ("here", "spark"):
            table = sql.Identifier(schema, name)
            source.execute(
                sql.SQL(
                    "CREATE TABLE {} (id int PRIMARY KEY, note text, updated_at int NOT NULL)"
                ).format(table)
            )
            source.execute(
                sql.SQL(
                    "INSERT INTO {} SELECT g, 'n' || g, g FROM generate_series(1, 500) g"
                ).format(table)
            )
        db_project.env["REPLICATOR_SOURCE_URL"] = tls_source.url
        db_project.write_config(
            {
                "tables": [
                    {"name": f"{schema}.{name}", "replication_key": "updated_at"}
                    for name in ("here", "spark")
                ]
            }
        )
        checked = db_project.run("check")
        assert checked.exit_code == 0, checked.output
        assert "reached with sslmode" not in checked.stdout
        for step in ("load", "batch"):
            here = db_project.run("sync", "-s", f"{schema}.here", env=IN_PROCESS)
            assert here.exit_code == 0, here.output
            spark = db_project.run("sync", "-v", "-s", f"{schema}.spark")  # every copy on Spark
            assert spark.exit_code == 0, spark.output
            on_spark = " on Spark" if step == "batch" else "partition(s) on "
            assert on_spark in spark.stderr and "in this process" not in spark.stderr
            for name, every in (("here", 7), ("spark", 5)):
                source.execute(
                    sql.SQL(
                        "UPDATE {} SET note = 'changed', updated_at = updated_at + 1000 "
                        "WHERE id % {} = 0"
                    ).format(sql.Identifier(schema, name), sql.Literal(every))
                )
        assert db_project.run("sync", "-s", f"{schema}.here", env=IN_PROCESS).exit_code == 0
        assert db_project.run("sync", "-s", f"{schema}.spark").exit_code == 0
        for name in ("here", "spark"):
            assert assert_same_table(source, dest_conn, schema, name) == 500


def test_check_warns_of_another_host_reached_without_verify_full(db_project, pg_servers, schema):
    """The test server, named as a remote host (libpq connects to `hostaddr`, and checks
    and reports `host`)."""
    port = pg_servers.source_url.rsplit(":", 1)[1].split("/")[0]
    remote = f"host=warehouse.example.internal hostaddr=127.0.0.1 port={port} user=postgres"
    db_project.write_config({"tables": [{"name": f"{schema}.t", "mode": "full-refresh"}]})
    checked = db_project.run("check", env={"REPLICATOR_SOURCE_URL": remote})
    assert (
        "warn  source: host warehouse.example.internal is reached with sslmode prefer (not "
        "encrypted): the rows cross the network" in checked.stdout
    ), checked.stdout
    assert "fix: add sslmode=verify-full and sslrootcert=" in checked.stdout
    assert "REPLICATOR_SOURCE_URL" in checked.stdout
    local = db_project.run("check")
    assert "reached with sslmode" not in local.stdout
