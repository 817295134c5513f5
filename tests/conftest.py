"""Shared fixtures: one throwaway PostgreSQL pair and one local Spark session per test run
(per pytest-xdist worker under `make test`).

Set REPLICATOR_TEST_SOURCE_URL and REPLICATOR_TEST_DEST_URL to use existing servers instead.
Each test that needs a database gets its own schema on both sides, dropped afterwards.
"""

from __future__ import annotations

import atexit
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import pytest
from click.testing import CliRunner, Result
from psycopg import sql

from replicator.cli.main import cli
from replicator.postgres.pgcluster import PgCluster

# The suite's own cache folder (Spark's class archive, the engine figures, the shipped
# environment), shared by the workers and kept between runs, whatever the shell says: the
# tests' copies never write their rates into the user's cache, where they would choose the
# engine of the user's own runs (a copy measured on a JVM a test had already started looks
# as if Spark started in no time).
TEST_CACHE = Path(tempfile.gettempdir()) / f"replicator-tests-cache-{os.getuid()}"
os.environ["REPLICATOR_CACHE_DIR"] = str(TEST_CACHE)
# When this suite run began: set by the first process to import this file (pytest's main
# process, before it starts the workers, which inherit it).
os.environ.setdefault("REPLICATOR_TESTS_STARTED", repr(time.time()))

ENV_VARS = (
    "REPLICATOR_SOURCE_URL",
    "REPLICATOR_DEST_URL",
    "REPLICATOR_WEBHOOK_URL",
    "REPLICATOR_WEBHOOK_SECRET",
    "REPLICATOR_SPARK_MASTER",
    "REPLICATOR_SPARK_REMOTE",
    "REPLICATOR_FAILPOINT",
    "REPLICATOR_PAUSE_AT",
    "REPLICATOR_PROGRESS_INTERVAL",
    "REPLICATOR_WARM",
)


@dataclass(frozen=True)
class Servers:
    source_url: str
    dest_url: str


def _raise_interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


@pytest.fixture(scope="session")
def pg_servers() -> Iterator[Servers]:
    """Two PostgreSQL servers (source with wal_level=logical), torn down even on Ctrl-C."""
    source = os.environ.get("REPLICATOR_TEST_SOURCE_URL")
    dest = os.environ.get("REPLICATOR_TEST_DEST_URL")
    if source and dest:
        yield Servers(source, dest)
        return
    base = Path(tempfile.mkdtemp(prefix="replicator-test-pg-"))
    clusters = [PgCluster(base / "source", logical=True), PgCluster(base / "dest")]

    def cleanup() -> None:
        for cluster in clusters:
            cluster.destroy()
        shutil.rmtree(base, ignore_errors=True)  # the clusters' folder, made above

    atexit.register(cleanup)
    previous = {s: signal.signal(s, _raise_interrupt) for s in (signal.SIGTERM, signal.SIGHUP)}
    try:
        for cluster in clusters:
            cluster.start()
        yield Servers(clusters[0].url(), clusters[1].url())
    finally:
        cleanup()
        for sig, handler in previous.items():
            signal.signal(sig, handler)


@pytest.fixture
def source_conn(pg_servers: Servers) -> Iterator[psycopg.Connection[Any]]:
    with psycopg.connect(pg_servers.source_url, autocommit=True) as conn:
        yield conn


@pytest.fixture
def dest_conn(pg_servers: Servers) -> Iterator[psycopg.Connection[Any]]:
    with psycopg.connect(pg_servers.dest_url, autocommit=True) as conn:
        yield conn


@pytest.fixture
def schema(
    request: pytest.FixtureRequest,
    source_conn: psycopg.Connection[Any],
    dest_conn: psycopg.Connection[Any],
) -> Iterator[str]:
    """A schema of the test's own on source and destination, dropped afterwards."""
    name = f"t_{request.node.name[:30].lower()}_{uuid.uuid4().hex[:8]}"
    name = "".join(ch if ch.isalnum() or ch == "_" else "_" for ch in name)
    for conn in (source_conn, dest_conn):
        conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(name)))
    try:
        yield name
    finally:
        for conn in (source_conn, dest_conn):
            conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(name)))


@pytest.fixture
def loader_role(
    pg_servers: Servers, source_conn: psycopg.Connection[Any], schema: str
) -> Iterator[str]:
    """The source URL of a role that may SELECT the test schema's tables (those created
    later too) and nothing else: no pg_monitor, no pg_read_all_stats, so it sees no other
    role's transaction start."""
    role = f"lp_{uuid.uuid4().hex[:8]}"
    source_conn.execute(sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(role)))
    source_conn.execute(
        sql.SQL("GRANT USAGE ON SCHEMA {} TO {}").format(
            sql.Identifier(schema), sql.Identifier(role)
        )
    )
    source_conn.execute(
        sql.SQL("ALTER DEFAULT PRIVILEGES IN SCHEMA {} GRANT SELECT ON TABLES TO {}").format(
            sql.Identifier(schema), sql.Identifier(role)
        )
    )
    try:
        yield pg_servers.source_url.replace("//postgres@", f"//{role}@", 1)
    finally:
        source_conn.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(role)))
        source_conn.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))


@dataclass(frozen=True)
class PasswordRole:
    """A login role that must authenticate with SCRAM and a hostile password."""

    name: str
    password: str


# An `@`, a `/`, a `${VAR}` and a quote: every character that has broken a connection string.
HOSTILE_PASSWORD = "p@ss/W0rd${HOME}'q"


@pytest.fixture
def password_role(source_conn: psycopg.Connection[Any]) -> Iterator[PasswordRole]:
    """A superuser role on the source whose TCP logins need its password (scram-sha-256),
    put ahead of the test cluster's `trust` lines in pg_hba.conf for the test's duration."""
    (hba_file,) = source_conn.execute("SHOW hba_file").fetchone()
    hba = Path(hba_file)
    if not os.access(hba, os.W_OK):
        pytest.skip("pg_hba.conf of the source is not writable here")
    role = PasswordRole(f"pw_{uuid.uuid4().hex[:8]}", HOSTILE_PASSWORD)
    source_conn.execute(
        sql.SQL("CREATE ROLE {} LOGIN SUPERUSER PASSWORD {}").format(
            sql.Identifier(role.name), sql.Literal(role.password)
        )
    )
    original = hba.read_text()
    hba.write_text(f"host all {role.name} 127.0.0.1/32 scram-sha-256\n{original}")
    source_conn.execute("SELECT pg_reload_conf()")
    try:
        yield role
    finally:
        hba.write_text(original)
        source_conn.execute("SELECT pg_reload_conf()")
        source_conn.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(role.name)))


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    """The run's local Spark session (local[2], UI off), started on first use."""
    from replicator.spark.session import start_spark

    session = start_spark("local[2]", {"spark.sql.shuffle.partitions": "2"})
    yield session
    session.stop()


@pytest.fixture(autouse=True)
def _clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """No REPLICATOR_* setting from the outer shell leaks into a test. Test tables are small:
    REPLICATOR_SPARK_MIN_ROWS=0 sends their copies through Spark all the same (the tests of
    the in-process path for small batches unset it). The CLI processes a test starts run as
    an installed replicator does, from compiled bytecode: a shell's PYTHONDONTWRITEBYTECODE
    would make each of them compile 130 modules again (the bytecode is git-ignored)."""
    for var in ENV_VARS:
        monkeypatch.delenv(var, raising=False)
    for var in [k for k in os.environ if k.startswith("OPENLINEAGE")]:  # nor OPENLINEAGE_*
        monkeypatch.delenv(var)
    monkeypatch.delenv("PYTHONDONTWRITEBYTECODE", raising=False)
    monkeypatch.setenv("REPLICATOR_SPARK_MIN_ROWS", "0")


@dataclass
class ProjectDir:
    """A project folder on disk plus a way to run the CLI against it."""

    path: Path
    env: dict[str, str]

    def write_config(self, document: dict[str, Any] | str) -> None:
        text = document if isinstance(document, str) else json.dumps(document, indent=2)
        (self.path / "tables-config.json").write_text(text, encoding="utf-8")

    def write(self, relative: str, text: str) -> Path:
        path = self.path / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
        return path

    def run(self, *args: str, env: dict[str, str | None] | None = None) -> Result:
        """`replicator <args> --project-dir <path>`, in-process."""
        merged: dict[str, str | None] = {**self.env, **(env or {})}
        return CliRunner().invoke(cli, [*args, "--project-dir", str(self.path)], env=merged)

    def sync(self, *args: str, env: dict[str, str | None] | None = None) -> Result:
        """`replicator sync <args>`, in-process, which must succeed (its output said if not)."""
        result = self.run("sync", *args, env=env)
        assert result.exit_code == 0, result.output
        return result

    def configure(self, schema: str, *tables: str, top: dict[str, Any] | None = None, **entry):
        """tables-config.json with these tables of `schema`, each with the keys `entry` gives
        (`replication_key="updated_at"`, `mode="cdc"`...); `top`: the config's other keys."""
        self.write_config(
            {"tables": [{"name": f"{schema}.{t}", **entry} for t in tables], **(top or {})}
        )

    def run_process(
        self, *args: str, env: dict[str, str] | None = None, drop: tuple[str, ...] = ()
    ) -> subprocess.CompletedProcess[str]:
        """`python -m replicator <args> --project-dir <path>` as its own process, as cron
        runs it (for SIGKILL failpoints, exit codes, a JVM-less environment)."""
        merged = {k: v for k, v in os.environ.items() if k not in drop}
        merged.update(self.env, **(env or {}))
        return subprocess.run(
            [sys.executable, "-m", "replicator", *args, "--project-dir", str(self.path)],
            env=merged,
            capture_output=True,
            text=True,
            stdin=subprocess.DEVNULL,
            timeout=300,
        )

    def files(self) -> set[str]:
        return {str(p.relative_to(self.path)) for p in self.path.rglob("*")}


@pytest.fixture
def project(tmp_path: Path) -> ProjectDir:
    """An empty project folder; connection settings are added by `db_project`."""
    folder = tmp_path / "project"
    folder.mkdir()
    (folder / "sync-state").mkdir()
    return ProjectDir(folder, {})


@pytest.fixture
def db_project(project: ProjectDir, pg_servers: Servers) -> ProjectDir:
    """A project whose connection settings point at the test servers."""
    project.env.update(
        REPLICATOR_SOURCE_URL=pg_servers.source_url, REPLICATOR_DEST_URL=pg_servers.dest_url
    )
    return project


@pytest.fixture
def writer(pg_servers):
    """A source session whose commits are flushed at once: the test clusters run with
    synchronous_commit off, and logical decoding reads only flushed WAL (a commit not yet
    flushed is the next run's, which the tests would see as a miss)."""
    import psycopg

    with psycopg.connect(pg_servers.source_url, autocommit=True) as conn:
        conn.execute("SET synchronous_commit = on")
        yield conn


@pytest.fixture
def cdc_project(db_project, source_conn):
    """A project whose slot and publication are dropped after the test."""
    yield db_project
    state = db_project.path / "sync-state" / "cdc.json"
    if state.exists():
        names = json.loads(state.read_text())
        source_conn.execute(
            "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots "
            "WHERE slot_name = %s",
            (names["slot"],),
        )
        source_conn.execute(
            sql.SQL("DROP PUBLICATION IF EXISTS {}").format(sql.Identifier(names["publication"]))
        )


# The longest files, started first: `make test`'s workers take whole files in collection
# order, and a long file collected last would keep one worker busy after the others are done.
# The suite's first Spark run: it leaves the driver's class archive to a detached build
# (spark/jvm_archive.py), and until it is there every driver JVM starts without it, slower.
FIRST = "test_the_first_spark_run_leaves_the_archive_to_a_detached_build_later_runs_map"
LONGEST_FIRST = (
    "test_spark_session.py",  # FIRST's file: the archive's build under way early
    "test_spark_connect.py",
    "test_soak.py",
    "test_spark_cluster.py",
    "test_operations.py",
    "test_crashes.py",
    "test_cli.py",
    "test_resume.py",
    "test_dbt_sources.py",  # a fresh machine installs dbt first (about a minute)
)


def pytest_configure(config: pytest.Config) -> None:
    """A suite started in the background (`make test &`, `nohup`) inherits SIGINT ignored,
    as would every command a test starts, and the tests of Ctrl-C would fail: the commands
    get SIGINT as a terminal's user has it."""
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    def rank(item: pytest.Item) -> tuple[int, bool]:
        name = item.path.name
        place = LONGEST_FIRST.index(name) if name in LONGEST_FIRST else len(LONGEST_FIRST)
        return place, item.name != FIRST

    items.sort(key=rank)  # stable: the rest keeps its order
