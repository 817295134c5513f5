"""Peers benchmark: replicator against the tools a user would pick instead, on the same clusters.

Two throwaway clusters (bench/'s usual settings for every tool: fsync, synchronous_commit and
full_page_writes off; wal_level=logical on the source; the default 10 replication slots and
WAL senders, which the at most 4 slots in use at once leave room for), one table of --rows rows
(bigint key, indexed `updated_at`, an int, a 75-byte text, numeric(12,2), jsonb: the table of
bench/incremental.py), and four workloads (`--workloads`, run in this order):

- full: a load into an empty destination. Baselines: `psql` COPY pipes, text and binary, into
  a table without a key (the seconds `ALTER TABLE ... ADD PRIMARY KEY` then takes are shown
  apart); peers: `pg_dump -t | psql` (schema, data, key and index), `pgcopydb clone` of that
  one table (a filter file), PostgreSQL's own subscription (`copy_data` into a second
  database, timed until pg_subscription_rel says 'r'), Sling (`sling run`, full-refresh);
  replicator `sync` (mode full-refresh) with an empty REPLICATOR_CACHE_DIR (the first run of
  an install) and with a warm one (the normal case).
- verify: 0.01% of a copy's rows changed, deleted or added (bench/verify.py's damage), then:
  the two-sided md5 of every row through `psql` at once (the baseline: it cannot say which
  rows), reladiff (key `id`, every column; its output must name every damaged key) and
  replicator `verify` (exit 1, its counts must add up to the damage). Repaired between rounds.
- incremental: 1% of the rows updated with a new `updated_at` and 0.2% inserted, then caught
  up by hand SQL (`psql` COPY of the rows past the copy's max `updated_at` into an UNLOGGED
  staging table, then INSERT ... ON CONFLICT DO UPDATE), Sling (mode incremental, primary key
  `id`, update key `updated_at`) and replicator `sync`, each into its own copy, in turns; and
  a `sync --follow` process (bench/follow_tick.py), whose catching-up run is timed by its own
  `follow.run` figure: a process kept running pays Python's start and imports once; and the
  same cron run with the warm helper up (`replicator warm start`, cli/warm/helper.py), which
  has them loaded.
  replicator's table has `lookback: 0`, as in bench/incremental.py: a round's changes are
  written within a second, so the default 5 s lookback would re-read the whole previous round
  (in production it re-reads the last seconds of a cron interval), which the others do not.
- cdc: --changes log changes (bench/cdc.py's mix and table: 60% updates, 20% inserts, 20%
  deletes) on a table of min(--rows, 1,000,000) rows, made once in transactions of 1..10,000
  rows and once in one transaction: PostgreSQL's subscription (disabled while the changes are
  made, then enabled and timed until its slot confirmed them) against replicator `sync` of a
  `mode: "cdc"` table, run alone and with the warm helper up (each with its own copy and
  slot). pgcopydb's `follow` is left out (PGCOPYDB_FOLLOW says why).

Before each timed run the script waits until neither cluster runs an autovacuum worker, then
checkpoints both: no tool pays for the vacuum of another's writes or for its dirty buffers.
Every time is the wall clock of the tool's process(es) (the subscription's: from the statement
to the condition). replicator runs as its CLI with its default settings. Every copy is checked
with the same query on both sides (count and md5 of every row): a tool whose copy differs is
"NOT EXACT" and never the fastest. One markdown table per workload: each run, the median, the
ratio to the fastest exact tool. A tool that fails prints its error and is marked failed; the
others go on. The clusters are removed at the end, on Ctrl-C and on SIGTERM too.

What it installs, unless --no-install (then it uses what is there):
- Sling: the `sling-linux-amd64` wheel from PyPI (the binary the `sling` package runs), and
  reladiff: `reladiff[postgresql]` from PyPI, both into bench/.peers-venv (gitignored; the
  project's .venv is never touched);
- pgcopydb: Debian's package (`apt-get update`, `apt-get install -y pgcopydb`; as root only).
A peer that cannot be installed is reported "not installed: why"; `--skip sling,pgcopydb,
reladiff` leaves peers out. Figures: bench/RESULTS.md (a quiet machine, the defaults).

    .venv/bin/python bench/peers.py                       # 5M rows, 1M changes, 2 repeats
    .venv/bin/python bench/peers.py --rows 3000000 --workloads full
    .venv/bin/python bench/peers.py --rows 100000 --changes 20000 --repeat 1   # a smoke run
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import psycopg
from procwatch import run_measured
from psycopg import sql

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import cdc
import verify
from follow_tick import FollowFailed, FollowProcess
from full_load import fresh_destination
from incremental import DDL, MERGE, fill

from replicator.postgres.pgcluster import PgCluster, find_pg_bin

BENCH = Path(__file__).resolve().parent
PEERS_VENV = BENCH / ".peers-venv"
WORKLOADS = ("full", "verify", "incremental", "cdc")
PEERS = ("sling", "pgcopydb", "reladiff")
INCREMENTAL_COPIES = ("sql", "sling", "replicator", "helper", "follow")  # a database each
HELPER_NOTE = "a cron run, with the warm helper up (replicator warm start)"
PGCOPYDB_FOLLOW = (
    "pgcopydb follow: not run. Debian's pgcopydb 0.10 decodes only through wal2json (a server "
    "plugin, postgresql-15-wal2json) from a slot made before its copy, and a run of it on this "
    "machine before this script missed a transaction: a feed not shown to be exact is not "
    "timed here."
)
FINGERPRINT = "SELECT count(*), md5(string_agg(md5(t::text), '' ORDER BY id)) FROM {} t"
KEYED = (
    "SELECT count(*) FROM pg_index WHERE indisprimary AND indrelid = to_regclass('bench_orders')"
)
INSERT_NEW = """
INSERT INTO bench_orders
SELECT g, g %% 100000, 'order note ' || md5(g::text) || md5((g + 1)::text),
       (g %% 100000) / 100.0, jsonb_build_object('id', g, 'ok', g %% 2 = 0), clock_timestamp()
FROM generate_series(%s::bigint, %s::bigint) g
"""
READY = "SELECT count(*) > 0 AND bool_and(srsubstate = 'r') FROM pg_subscription_rel"
UPDATE_SOME = (
    "UPDATE bench_orders SET amount = amount + 1, updated_at = clock_timestamp() "
    "WHERE id %% 100 = %s"
)


class ToolFailed(Exception):
    """A tool's run that did not do its job: the message says how (exit code, its stderr)."""


@dataclass
class Tool:
    """One row of a workload's table: its runs, whether every copy was exact, what went wrong."""

    name: str
    runs: list[float] = field(default_factory=list)
    exact: bool = True
    status: str = ""  # empty: it ran; else "failed: ...", "not installed: ...", "skipped"
    notes: list[str] = field(default_factory=list)
    extra: dict[str, list[float]] = field(default_factory=dict)
    peaks: list[float] = field(default_factory=list)  # MB, each run's process tree at its peak

    @property
    def usable(self) -> bool:
        return not self.status


@dataclass
class Peers:
    """Where each peer's program is, or why it is not there."""

    paths: dict[str, str] = field(default_factory=dict)
    missing: dict[str, str] = field(default_factory=dict)
    versions: dict[str, str] = field(default_factory=dict)


# ----------------------------------------------------------------------------- installation


def _quiet(command: list[str], env: dict[str, str] | None = None) -> tuple[int, str]:
    done = subprocess.run(
        command, capture_output=True, text=True, stdin=subprocess.DEVNULL, env=env
    )
    return done.returncode, (done.stdout + done.stderr).strip()


def _venv_python(install: bool) -> Path | None:
    python = PEERS_VENV / "bin" / "python"
    if not python.exists() and install:
        _quiet([sys.executable, "-m", "venv", str(PEERS_VENV)])
    return python if python.exists() else None


def _pip_peer(package: str, probe: Callable[[Path], str | None], install: bool) -> str | None:
    """The peer's program in bench/.peers-venv, installed there first when missing."""
    python = _venv_python(install)
    if python is None:
        raise ToolFailed(f"no venv at {PEERS_VENV}")
    found = probe(python)
    if found is None and install:
        code, output = _quiet([str(python), "-m", "pip", "install", "-q", package])
        if code != 0:
            raise ToolFailed(f"pip install {package}: {output.splitlines()[-1:]}")
        found = probe(python)
    return found


def _sling_probe(python: Path) -> str | None:
    code, output = _quiet([str(python), "-c", "import sling_linux_amd64 as s; print(s.SLING_BIN)"])
    return output if code == 0 and Path(output).is_file() else None


def _reladiff_probe(python: Path) -> str | None:
    program = python.parent / "reladiff"
    return str(program) if program.is_file() else None


def _pgcopydb(install: bool) -> str | None:
    if shutil.which("pgcopydb") is None and install:
        if os.geteuid() != 0:
            raise ToolFailed("needs root to install: apt-get install pgcopydb")
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        _quiet(["apt-get", "update", "-qq"], env)
        code, output = _quiet(["apt-get", "install", "-y", "-qq", "pgcopydb"], env)
        if code != 0:
            raise ToolFailed(f"apt-get install pgcopydb: {output.splitlines()[-1:]}")
    return shutil.which("pgcopydb")


def find_peers(skip: set[str], install: bool) -> Peers:
    """Each peer's program, installing what is missing; never fails the run."""
    peers = Peers()
    finders: dict[str, Callable[[], str | None]] = {
        "sling": lambda: _pip_peer("sling-linux-amd64", _sling_probe, install),
        "reladiff": lambda: _pip_peer("reladiff[postgresql]", _reladiff_probe, install),
        "pgcopydb": lambda: _pgcopydb(install),
    }
    for name, finder in finders.items():
        if name in skip:
            peers.missing[name] = "skipped (--skip)"
            continue
        try:
            path = finder()
        except ToolFailed as exc:
            path, why = None, str(exc)
        else:
            why = "not found (--no-install)" if not install else "not found after installing"
        if path is None:
            peers.missing[name] = f"not installed: {why}"
            continue
        peers.paths[name] = path
        found = re.search(r"\d+\.\d+[\w.-]*", _quiet([path, "--version"])[1])
        peers.versions[name] = found.group() if found else "(version unknown)"
    return peers


# ----------------------------------------------------------------------------- running


class Bench:
    """The clusters, the programs and the folders a workload uses."""

    def __init__(self, args: argparse.Namespace, base: Path, peers: Peers) -> None:
        self.args, self.base, self.peers = args, base, peers
        self.source = PgCluster(base / "source", logical=True)
        self.dest = PgCluster(base / "dest")
        pg_bin = find_pg_bin()
        self.psql = shlex.quote(str(pg_bin / "psql"))
        self.pg_dump = shlex.quote(str(pg_bin / "pg_dump"))
        self.cli = f"{shlex.quote(sys.executable)} -m replicator"
        self.warm_cache = base / "cache"
        self.helper_cache = base / "helper-cache"  # the warm helper's socket: only there
        self.counter = 0
        self.worker_started = 0.0
        self.peak_mb = 0.0  # the largest process tree of the commands timed since attempt reset it

    def launcher_rested(self, url: str) -> None:
        """Wait out the logical replication launcher's throttle: it starts a worker at most
        once per wal_retrieve_retry_interval (5 s), which would time the launcher, not the
        copy, when a subscription's last worker started just before (small --rows only)."""
        with psycopg.connect(url) as conn:
            (interval_ms,) = conn.execute(
                "SELECT setting::int FROM pg_settings WHERE name = 'wal_retrieve_retry_interval'"
            ).fetchone()
        time.sleep(max(0.0, self.worker_started + interval_ms / 1000 + 0.1 - time.monotonic()))

    def settled(self) -> None:
        """Before each timed run: no autovacuum worker on either cluster (the last tool's
        writes, or the round's changes, set one off on 2 cores: up to seconds of CPU taken
        from whichever tool came next), then a CHECKPOINT on each, so that no tool pays for
        another's dirty buffers."""
        for cluster in (self.source, self.dest):
            wait_until(
                cluster.url(),
                "SELECT NOT EXISTS (SELECT FROM pg_stat_activity "
                "WHERE backend_type = 'autovacuum worker')",
                "autovacuum to finish",
                timeout=600,
            )
        for cluster in (self.source, self.dest):
            with psycopg.connect(cluster.url(), autocommit=True) as conn:
                conn.execute("CHECKPOINT")

    def folder(self, name: str) -> Path:
        """A new folder under the run's base (logs, projects, work dirs)."""
        self.counter += 1
        path = self.base / f"{name}-{self.counter}"
        path.mkdir(parents=True)
        return path

    def timed(self, command: str, env: dict[str, str] | None = None, ok: int = 0) -> float:
        """Wall seconds of a shell command; ToolFailed (with its stderr's end) on another exit."""
        log = self.folder("log") / "stderr"
        measured = run_measured(f"{{ {command} ; }} 2> {shlex.quote(str(log))}", env)
        if measured.returncode != ok:
            tail = log.read_text(errors="replace").strip().splitlines()[-6:]
            raise ToolFailed(f"exit {measured.returncode}: " + " | ".join(tail))
        self.peak_mb = max(self.peak_mb, measured.peak_rss_mb)
        return measured.seconds

    def replicator_env(self, source_url: str, dest_url: str, cache: Path | None = None) -> dict:
        """The environment with no REPLICATOR_* setting of the caller's: the defaults. Nor
        PYTHONDONTWRITEBYTECODE: an installed replicator imports compiled bytecode, and a
        shell that forbids writing it would make every run compile 130 modules again."""
        env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith("REPLICATOR_") and k != "PYTHONDONTWRITEBYTECODE"
        }
        env.update(
            REPLICATOR_SOURCE_URL=source_url,
            REPLICATOR_DEST_URL=dest_url,
            REPLICATOR_CACHE_DIR=str(cache or self.warm_cache),
        )
        return env

    @contextlib.contextmanager
    def helper(self) -> Iterator[None]:
        """The warm helper up (in its own cache folder: runs with another one never reach
        it) for the block."""
        env = {**self.replicator_env("", "", self.helper_cache)}
        self.timed(f"{self.cli} warm start", env)
        try:
            yield
        finally:
            self.timed(f"{self.cli} warm stop", env)

    def sling_env(self, source_url: str, dest_url: str) -> dict:
        return {
            **os.environ,
            "SLING_DISABLE_TELEMETRY": "true",
            "SLING_HOME_DIR": str(self.base / "sling-home"),
            "BENCH_SOURCE": f"{source_url}?sslmode=disable",
            "BENCH_DEST": f"{dest_url}?sslmode=disable",
        }

    def sling(self, mode: str) -> str:
        keys = " --primary-key id --update-key updated_at" if mode == "incremental" else ""
        return (
            f"{shlex.quote(self.peers.paths['sling'])} run --src-conn BENCH_SOURCE "
            "--src-stream public.bench_orders --tgt-conn BENCH_DEST "
            f"--tgt-object public.bench_orders --mode {mode}{keys}"
        )

    def project(self, table: dict) -> Path:
        folder = self.folder("project")
        (folder / "sync-state").mkdir()
        (folder / "tables-config.json").write_text(json.dumps({"tables": [table]}))
        return folder

    def sync(self, project: Path) -> str:
        return f"{self.cli} sync -q --project-dir {shlex.quote(str(project))}"

    def create_database(self, cluster: PgCluster, name: str) -> str:
        with psycopg.connect(cluster.url(), autocommit=True) as conn:
            conn.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
            )
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
        return cluster.url(name)

    def drop_database(self, cluster: PgCluster, name: str) -> None:
        with psycopg.connect(cluster.url(), autocommit=True) as conn:
            conn.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
            )


def fingerprint(url: str) -> tuple[int, str] | None:
    """Count and md5 of every row of bench_orders (None: no such table)."""
    query = sql.SQL(FINGERPRINT).format(sql.Identifier("bench_orders"))
    with psycopg.connect(url) as conn:
        if conn.execute("SELECT to_regclass('bench_orders')").fetchone()[0] is None:
            return None
        return conn.execute(query).fetchone()


def vacuumed(url: str) -> None:
    """VACUUM (ANALYZE) of the copy at `url`, if it is there: a loaded table that stays
    would set off an autovacuum, up to a minute later, in another tool's timed turn (at 20M
    rows, tens of seconds of two cores' IO and CPU)."""
    try:
        conn = psycopg.connect(url, autocommit=True)
    except psycopg.OperationalError:  # a tool that failed before it made its database
        return
    with conn:
        if conn.execute("SELECT to_regclass('bench_orders') IS NOT NULL").fetchone()[0]:
            conn.execute("VACUUM (ANALYZE) bench_orders")


def has_primary_key(url: str) -> bool:
    with psycopg.connect(url) as conn:
        return conn.execute(KEYED).fetchone()[0] > 0


def wait_until(url: str, query: str, what: str, params: tuple = (), timeout: float = 3600) -> None:
    """Poll `query` (one boolean) until true; ToolFailed past the deadline."""
    deadline = time.monotonic() + timeout
    with psycopg.connect(url, autocommit=True) as conn:
        while not conn.execute(query, params).fetchone()[0]:
            if time.monotonic() > deadline:
                raise ToolFailed(f"{what}: not done after {timeout:.0f} s")
            time.sleep(0.05)


def attempt(bench: Bench, tool: Tool, run: Callable[[], tuple[float, bool]]) -> None:
    """One timed run of a tool and whether its result was right; a failure marks it failed.
    Its peak RSS is that of the commands it ran (none for a server's own work; for a run
    through the warm helper, whose command runs in the helper's child, none either)."""
    if not tool.usable:
        return
    bench.peak_mb = 0.0
    try:
        seconds, exact = run()
    except (ToolFailed, psycopg.Error, OSError, ValueError, KeyError) as exc:
        tool.status = f"failed: {exc}".replace("\n", " ")[:400]
        print(f"  {tool.name}: {tool.status}", flush=True)
        return
    tool.runs.append(seconds)
    tool.exact = tool.exact and exact
    extras = "".join(f" ({name} {runs[-1]:.2f} s)" for name, runs in tool.extra.items())
    if bench.peak_mb and HELPER_NOTE not in tool.name:
        tool.peaks.append(bench.peak_mb)
        extras += f" (peak RSS {bench.peak_mb:,.0f} MB)"
    print(f"  {tool.name}: {seconds:.2f} s{extras}{'' if exact else ', NOT EXACT'}", flush=True)


def copying(
    run: Callable[[], float], copy_url: str, expected: tuple | None
) -> Callable[[], tuple[float, bool]]:
    """A run whose result is a copy: right when the copy's fingerprint is the source's."""

    def checked() -> tuple[float, bool]:
        seconds = run()
        return seconds, fingerprint(copy_url) == expected

    return checked


def prepare(tool: Tool, setup: Callable[[], object], copy_url: str, source_url: str) -> None:
    """A tool's untimed first load; one that fails or is not exact marks the tool failed."""
    if not tool.usable:
        return
    try:
        setup()
        if fingerprint(copy_url) != fingerprint(source_url):
            raise ToolFailed("its first load is not a copy of the source")
    except (ToolFailed, psycopg.Error, OSError) as exc:
        tool.status = f"failed in its first load: {exc}".replace("\n", " ")[:400]
        print(f"  {tool.name}: {tool.status}", flush=True)


def peer_tool(bench: Bench, name: str, label: str) -> Tool:
    """The row of a peer, already marked when the peer is missing."""
    return Tool(label, status=bench.peers.missing.get(name, ""))


# ----------------------------------------------------------------------------- source table


def build_source(url: str, rows: int) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(DDL)
        fill(conn, rows)
        conn.execute("CREATE INDEX ON bench_orders (updated_at)")
        conn.execute("VACUUM ANALYZE bench_orders")


# ----------------------------------------------------------------------------- full load


def full_load(bench: Bench) -> list[Tool]:
    """Each tool loads the table into an empty destination, --repeat times."""
    src_url, dst_url = bench.source.url(), bench.dest.url()
    src, dst = shlex.quote(src_url), shlex.quote(dst_url)
    sub_url = bench.create_database(bench.dest, "subscriber")
    with psycopg.connect(src_url, autocommit=True) as conn:
        conn.execute("CREATE PUBLICATION bench_full FOR TABLE bench_orders")
    no_key = DDL.replace(" PRIMARY KEY", "")
    copy_out, copy_in = "\\copy bench_orders TO STDOUT", "\\copy bench_orders FROM STDIN"
    add_key = shlex.quote("ALTER TABLE bench_orders ADD PRIMARY KEY (id)")

    def pipe(tool: Tool, options: str) -> float:
        fresh_destination(dst_url, no_key)
        seconds = bench.timed(
            f"{bench.psql} {src} -c {shlex.quote(copy_out + options)} | "
            f"{bench.psql} {dst} -c {shlex.quote(copy_in + options)}"
        )
        key = bench.timed(f"{bench.psql} {dst} -v ON_ERROR_STOP=1 -c {add_key}")
        tool.extra.setdefault("+ primary key", []).append(key)
        return seconds

    def pg_dump() -> float:
        fresh_destination(dst_url, None)
        return bench.timed(
            f"{bench.pg_dump} -t bench_orders {src} | {bench.psql} -q -v ON_ERROR_STOP=1 {dst}"
        )

    def pgcopydb() -> float:
        # Its own new database: it also copies what else the source has (the publication)
        target = shlex.quote(bench.create_database(bench.dest, "pgcopydb_target"))
        work = bench.folder("pgcopydb")
        (work / "filters.ini").write_text("[include-only-table]\npublic.bench_orders\n")
        # setsid: pgcopydb signals its whole process group when it fails (this script too)
        return bench.timed(
            f"setsid -w {shlex.quote(bench.peers.paths['pgcopydb'])} clone "
            f"--source {src} --target {target} --dir {shlex.quote(str(work / 'work'))} "
            f"--filters {shlex.quote(str(work / 'filters.ini'))} --no-owner --no-acl"
        )

    def subscription() -> float:
        with psycopg.connect(sub_url, autocommit=True) as conn:
            conn.execute("DROP TABLE IF EXISTS bench_orders")
            conn.execute(DDL)
            started = time.monotonic()
            conn.execute(
                sql.SQL(
                    "CREATE SUBSCRIPTION bench_full CONNECTION {} PUBLICATION bench_full"
                ).format(sql.Literal(src_url))
            )
        try:
            wait_until(sub_url, READY, "the subscription's initial copy")
            return time.monotonic() - started
        finally:
            bench.worker_started = time.monotonic()
            with psycopg.connect(sub_url, autocommit=True) as conn:
                conn.execute("DROP SUBSCRIPTION bench_full")  # and its slot on the source

    def sling() -> float:
        fresh_destination(dst_url, None)
        return bench.timed(bench.sling("full-refresh"), bench.sling_env(src_url, dst_url))

    def replicator(cache: Callable[[], Path]) -> Callable[[], float]:
        def run() -> float:
            fresh_destination(dst_url, None)
            project = bench.project({"name": "public.bench_orders", "mode": "full-refresh"})
            return bench.timed(bench.sync(project), bench.replicator_env(src_url, dst_url, cache()))

        return run

    def empty_cache() -> Path:  # the first such run may warm the shared one: it is new too
        return bench.warm_cache if not bench.warm_cache.exists() else bench.folder("cache")

    text, binary = Tool("psql COPY pipe (text), no key"), Tool("psql COPY pipe (binary), no key")
    text.notes.append("baseline")
    binary.notes.append("baseline")
    dump = Tool("pg_dump -t | psql (table with key)")
    dump.notes.append("also builds the updated_at index")
    copydb = peer_tool(bench, "pgcopydb", "pgcopydb clone (filter: the table)")
    copydb.notes.append("also builds the updated_at index")
    sub = Tool("PostgreSQL subscription (copy_data)")
    sub.notes.append("table with key made beforehand")
    sling_row = peer_tool(bench, "sling", "Sling run (full-refresh)")
    cold = Tool("replicator sync, first run of an install (empty cache)")
    warm = Tool("replicator sync")
    runs: list[tuple[Tool, Callable[[], float], str]] = [
        (text, lambda: pipe(text, ""), dst_url),
        (binary, lambda: pipe(binary, " (FORMAT binary)"), dst_url),
        (dump, pg_dump, dst_url),
        (copydb, pgcopydb, bench.dest.url("pgcopydb_target")),
        (sub, subscription, sub_url),
        (sling_row, sling, dst_url),
        (cold, replicator(empty_cache), dst_url),
        (warm, replicator(lambda: bench.warm_cache), dst_url),
    ]
    source_print = fingerprint(src_url)
    for round_no in range(bench.args.repeat):
        print(f"full load, round {round_no + 1}", flush=True)
        for tool, run, url in runs:
            bench.settled()
            attempt(bench, tool, copying(run, url, source_print))
            if url != dst_url:  # a copy that stays: vacuumed now, not by autovacuum in a turn
                vacuumed(url)
            if tool.usable and "no primary key" not in tool.notes and not has_primary_key(url):
                tool.notes.append("no primary key")
    with psycopg.connect(src_url, autocommit=True) as conn:
        conn.execute("DROP PUBLICATION bench_full")
    bench.drop_database(bench.dest, "subscriber")
    bench.drop_database(bench.dest, "pgcopydb_target")
    fresh_destination(dst_url, None)
    return [tool for tool, _, _ in runs]


# ----------------------------------------------------------------------------- verify


def verify_workload(bench: Bench) -> list[Tool]:
    """Damage 0.01% of a copy, then each tool finds it; repaired (untimed) between rounds."""
    src_url, rows = bench.source.url(), bench.args.rows
    copy_url = bench.create_database(bench.dest, "verify_copy")
    project = bench.project({"name": "public.bench_orders", "replication_key": "updated_at"})
    where = f"--project-dir {shlex.quote(str(project))}"
    env = bench.replicator_env(src_url, copy_url)
    bench.timed(bench.sync(project), env)  # the copy to damage (untimed)
    with psycopg.connect(copy_url, autocommit=True) as conn:
        conn.execute("VACUUM ANALYZE bench_orders")
    baseline = Tool("md5 of every row, both sides at once (psql)")
    baseline.notes.append("baseline: says whether, not which rows")
    reladiff = peer_tool(bench, "reladiff", "reladiff (key id, every column)")
    ours = Tool("replicator verify")
    for round_no in range(bench.args.repeat):
        damaged = verify.damage(copy_url, rows, round_no)
        print(f"verify, round {round_no + 1}: {damaged:,} rows damaged", flush=True)
        runs = [
            (baseline, lambda: _hash_both(bench, src_url, copy_url)),
            (reladiff, lambda d=damaged: _reladiff(bench, src_url, copy_url, d)),
            (ours, lambda d=damaged: _verify(bench, where, env, d)),
        ]
        for tool, run in _turn(runs, round_no):
            bench.settled()
            attempt(bench, tool, run)
        bench.timed(f"{bench.cli} verify --repair -q {where}", env)
        if fingerprint(copy_url) != fingerprint(src_url):
            raise ToolFailed("the copy differs from the source after verify --repair")
    bench.drop_database(bench.dest, "verify_copy")
    return [baseline, reladiff, ours]


def _turn(runs: list, round_no: int) -> list:
    """The tools in turns: each round starts one further down the list."""
    shift = round_no % len(runs)
    return runs[shift:] + runs[:shift]


def _hash_both(bench: Bench, src_url: str, copy_url: str) -> tuple[float, bool]:
    """Right when both hashes came back and differ (the copy was damaged)."""
    query = shlex.quote(FINGERPRINT.format("bench_orders"))
    out = bench.folder("hash")
    first, second = shlex.quote(str(out / "source")), shlex.quote(str(out / "copy"))
    seconds = bench.timed(
        f"{bench.psql} {shlex.quote(src_url)} -Atc {query} > {first} & one=$!; "
        f"{bench.psql} {shlex.quote(copy_url)} -Atc {query} > {second} & two=$!; "
        "wait $one && wait $two"
    )
    hashes = [(out / side).read_text().strip() for side in ("source", "copy")]
    return seconds, all(hashes) and hashes[0] != hashes[1]


def _reladiff(bench: Bench, src_url: str, copy_url: str, damaged: int) -> tuple[float, bool]:
    """Right when reladiff's JSON lines name every damaged key and no other."""
    out = bench.folder("reladiff") / "diff.jsonl"
    seconds = bench.timed(
        f"{shlex.quote(bench.peers.paths['reladiff'])} {shlex.quote(src_url)} bench_orders "
        f"{shlex.quote(copy_url)} bench_orders -k id -c % --json > {shlex.quote(str(out))}",
        {**os.environ, "COLUMNS": "1000000"},  # its printer wraps lines at the terminal's width
    )
    lines = [json.loads(line) for line in out.read_text().splitlines() if line.strip()]
    keys = {str(line[1][0]) for line in lines}  # ["-" or "+", [id, ...]]: a change is both
    if len(keys) != damaged:
        print(f"  reladiff named {len(keys):,} rows; {damaged:,} were damaged", flush=True)
    return seconds, len(keys) == damaged


def _verify(bench: Bench, where: str, env: dict, damaged: int) -> tuple[float, bool]:
    """Right when verify exits 1 and its missing + extra + different add up to the damage."""
    out = bench.folder("verify") / "verify.json"
    command = f"{bench.cli} verify -q --json {where} > {shlex.quote(str(out))}"
    seconds = bench.timed(command, env, ok=1)
    (table,) = json.loads(out.read_text())
    found = table["missing"] + table["extra"] + table["different"]
    if found != damaged:
        print(f"  replicator verify found {found:,} rows; {damaged:,} were damaged", flush=True)
    return seconds, found == damaged


# ----------------------------------------------------------------------------- incremental


def incremental(bench: Bench) -> list[Tool]:
    """1% updated and 0.2% inserted per round; each tool catches up its own copy, in turns."""
    src_url = bench.source.url()
    urls = {name: bench.create_database(bench.dest, f"inc_{name}") for name in INCREMENTAL_COPIES}
    hand = Tool("SQL by hand (psql COPY into staging, INSERT ON CONFLICT)")
    hand.notes.append("baseline")
    sling = peer_tool(bench, "sling", "Sling run (incremental)")
    ours = Tool("replicator sync (lookback: 0)")
    helped = Tool(f"replicator sync, {HELPER_NOTE} (lookback: 0)")
    warm = Tool("replicator sync --follow, the run that caught up (lookback: 0)")
    warm.notes.append("the process's own figure for that run (follow.run seconds)")
    # Each round writes its 1% within a second: the default 5 s lookback would re-read the
    # whole previous round, which a cron interval of minutes re-reads a few seconds of.
    table = {"name": "public.bench_orders", "replication_key": "updated_at", "lookback": 0}
    project, warm_project = bench.project(table), bench.project(table)
    helped_project = bench.project(table)
    env = bench.replicator_env(src_url, urls["replicator"])
    helped_env = bench.replicator_env(src_url, urls["helper"], bench.helper_cache)
    warm_env = bench.replicator_env(src_url, urls["follow"])
    sling_env = bench.sling_env(src_url, urls["sling"])
    src, dst = shlex.quote(src_url), shlex.quote(urls["sql"])
    print("incremental: first loads (untimed)", flush=True)
    prepare(hand, lambda: _hand_setup(bench, src, dst), urls["sql"], src_url)
    sling_first = lambda: bench.timed(bench.sling("incremental"), sling_env)  # noqa: E731
    prepare(sling, sling_first, urls["sling"], src_url)
    prepare(ours, lambda: bench.timed(bench.sync(project), env), urls["replicator"], src_url)
    helped_sync = bench.sync(helped_project)
    prepare(helped, lambda: bench.timed(helped_sync, helped_env), urls["helper"], src_url)
    prepare(warm, lambda: bench.timed(bench.sync(warm_project), warm_env), urls["follow"], src_url)
    command = [sys.executable, "-m", "replicator", "sync", "--project-dir", str(warm_project)]
    follower = FollowProcess(command, warm_env)
    with bench.helper():
        try:
            follower.settle()
            steps = {
                "sql": (hand, lambda: bench.timed(_by_hand(bench, src, dst))),
                "sling": (sling, lambda: bench.timed(bench.sling("incremental"), sling_env)),
                "replicator": (ours, lambda: bench.timed(bench.sync(project), env)),
                "helper": (helped, lambda: bench.timed(helped_sync, helped_env)),
                "follow": (warm, lambda: _follow_run(follower)),
            }
            _incremental_rounds(bench, steps, urls)
        except FollowFailed as exc:
            warm.status = f"failed: {exc}"
        finally:
            follower.stop()
    for name in INCREMENTAL_COPIES:
        bench.drop_database(bench.dest, f"inc_{name}")
    return [hand, sling, ours, helped, warm]


def _incremental_rounds(bench: Bench, steps: dict, urls: dict[str, str]) -> None:
    src_url, rows = bench.source.url(), bench.args.rows
    next_id = rows + 1
    for round_no in range(1, bench.args.repeat + 1):
        next_id = _change(src_url, rows, round_no, next_id)
        print(f"incremental, round {round_no}", flush=True)
        source_print = fingerprint(src_url)
        runs = [
            (tool, copying(run, urls[name], source_print)) for name, (tool, run) in steps.items()
        ]
        for tool, run in _turn(runs, round_no):
            bench.settled()
            attempt(bench, tool, run)


def _follow_run(follower: FollowProcess) -> float:
    try:
        return follower.run_that_copies()
    except FollowFailed as exc:
        raise ToolFailed(str(exc)) from None


def _hand_setup(bench: Bench, src: str, dst: str) -> None:
    """The hand copy: pg_dump's table (key and index) and an UNLOGGED staging table."""
    bench.timed(f"{bench.pg_dump} -t bench_orders {src} | {bench.psql} -q -v ON_ERROR_STOP=1 {dst}")
    stage = DDL.replace("CREATE TABLE bench_orders", "CREATE UNLOGGED TABLE stage")
    bench.timed(
        f"{bench.psql} {dst} -v ON_ERROR_STOP=1 -c {shlex.quote(stage.replace(' PRIMARY KEY', ''))}"
    )


def _by_hand(bench: Bench, src: str, dst: str) -> str:
    """The rows past the copy's newest `updated_at`, staged, then merged by key."""
    newest = shlex.quote("SELECT max(updated_at) FROM bench_orders")
    copy_out = "\\copy (SELECT * FROM bench_orders WHERE updated_at > '$since') TO STDOUT"
    copy_in = shlex.quote("\\copy stage FROM STDIN")
    return (
        f"since=$({bench.psql} {dst} -Atc {newest}) && "
        f'{bench.psql} {src} -c "{copy_out}" | {bench.psql} {dst} -c {copy_in} && '
        f"{bench.psql} {dst} -v ON_ERROR_STOP=1 -c {shlex.quote(MERGE)}"
    )


def _change(src_url: str, rows: int, round_no: int, next_id: int) -> int:
    """Update 1% of the rows (a new updated_at), insert 0.2% more; the next free key."""
    inserts = max(rows // 500, 1)
    with psycopg.connect(src_url) as conn:  # one transaction: no run sees half a round
        conn.execute(UPDATE_SOME, (round_no % 100,))
        conn.execute(INSERT_NEW, (next_id, next_id + inserts - 1))
    return next_id + inserts


# ----------------------------------------------------------------------------- cdc


@dataclass
class CdcRound:
    """One round's own databases, slot and project: made, changed, timed, dropped."""

    name: str
    source_url: str = ""
    sub_url: str = ""
    ours_url: str = ""
    helped_url: str = ""
    project: Path | None = None
    helped_project: Path | None = None
    target: str = ""


def cdc_workload(bench: Bench) -> list[tuple[str, list[Tool]]]:
    """The same changes in many transactions and in one, each applied by both tools."""
    tables = []
    rows = min(bench.args.rows, 1_000_000)
    for variant, largest in (("transactions of 1..10,000 rows", 10_000), ("one transaction", 0)):
        sub = Tool("PostgreSQL subscription (enable -> caught up)")
        ours = Tool('replicator sync (mode "cdc", the drain)')
        helped = Tool(f'replicator sync (mode "cdc", the drain), {HELPER_NOTE}')
        for round_no in range(bench.args.repeat):
            print(f"cdc ({variant}), round {round_no + 1}", flush=True)
            cdc_round = CdcRound(f"cdc_{largest}_{round_no}")
            try:
                _cdc_setup(bench, cdc_round, rows, ours, helped)
                _cdc_changes(bench, cdc_round, rows, largest)
                with bench.helper():
                    _cdc_timed(bench, cdc_round, round_no, [sub, ours, helped])
            finally:
                _cdc_teardown(bench, cdc_round)
        title = f"{bench.args.changes:,} log changes in {variant}, a {rows:,}-row table"
        tables.append((title, [sub, ours, helped]))
    return tables


def _cdc_changes(bench: Bench, cdc_round: CdcRound, rows: int, largest: int) -> None:
    """bench/cdc.py's mix; the source's flushed WAL position after them is the target."""
    cdc.make_changes(cdc_round.source_url, rows, bench.args.changes, largest)
    with psycopg.connect(cdc_round.source_url) as conn:
        (cdc_round.target,) = conn.execute("SELECT pg_current_wal_flush_lsn()::text").fetchone()


def _cdc_timed(bench: Bench, cdc_round: CdcRound, round_no: int, tools: list[Tool]) -> None:
    sub, ours, helped = tools
    source_print = fingerprint(cdc_round.source_url)
    env, helped_env = _cdc_env(bench, cdc_round), _cdc_env(bench, cdc_round, helped=True)
    drain, helped_drain = bench.sync(cdc_round.project), bench.sync(cdc_round.helped_project)
    runs = [
        (sub, copying(lambda: _catch_up(bench, cdc_round), cdc_round.sub_url, source_print)),
        (ours, copying(lambda: bench.timed(drain, env), cdc_round.ours_url, source_print)),
        (
            helped,
            copying(
                lambda: bench.timed(helped_drain, helped_env), cdc_round.helped_url, source_print
            ),
        ),
    ]
    for tool, run in _turn(runs, round_no):
        bench.settled()
        attempt(bench, tool, run)


def _cdc_env(bench: Bench, cdc_round: CdcRound, helped: bool = False) -> dict:
    if helped:
        return bench.replicator_env(cdc_round.source_url, cdc_round.helped_url, bench.helper_cache)
    return bench.replicator_env(cdc_round.source_url, cdc_round.ours_url)


def _cdc_setup(bench: Bench, cdc_round: CdcRound, rows: int, ours: Tool, helped: Tool) -> None:
    """bench/cdc.py's table in a new source database, copied by a subscription (then
    disabled) and by replicator (a `cdc` table's first sync, untimed)."""
    name = cdc_round.name
    cdc_round.source_url = bench.create_database(bench.source, name)
    with psycopg.connect(cdc_round.source_url, autocommit=True) as conn:
        conn.execute(cdc.DDL)
        for low in range(1, rows + 1, 1_000_000):
            conn.execute(cdc.FILL, (low, min(rows, low + 999_999)))
        conn.execute("CREATE PUBLICATION bench_cdc FOR TABLE bench_orders")
    cdc_round.sub_url = bench.create_database(bench.dest, f"{name}_sub")
    cdc_round.ours_url = bench.create_database(bench.dest, f"{name}_ours")
    cdc_round.helped_url = bench.create_database(bench.dest, f"{name}_helped")
    with psycopg.connect(cdc_round.sub_url, autocommit=True) as conn:
        conn.execute(cdc.DDL)
        conn.execute(
            sql.SQL(
                "CREATE SUBSCRIPTION bench_cdc CONNECTION {} PUBLICATION bench_cdc "
                "WITH (slot_name = {})"
            ).format(sql.Literal(cdc_round.source_url), sql.Literal(name))
        )
    wait_until(cdc_round.sub_url, READY, "the subscription's initial copy")
    bench.worker_started = time.monotonic()
    with psycopg.connect(cdc_round.sub_url, autocommit=True) as conn:
        conn.execute("ALTER SUBSCRIPTION bench_cdc DISABLE")
    cdc_round.project = bench.project({"name": "public.bench_orders", "mode": "cdc"})
    cdc_round.helped_project = bench.project({"name": "public.bench_orders", "mode": "cdc"})
    for tool, project, url, helped_env in (
        (ours, cdc_round.project, cdc_round.ours_url, False),
        (helped, cdc_round.helped_project, cdc_round.helped_url, True),
    ):
        sync, env = bench.sync(project), _cdc_env(bench, cdc_round, helped_env)
        prepare(tool, lambda s=sync, e=env: bench.timed(s, e), url, cdc_round.source_url)


def _catch_up(bench: Bench, cdc_round: CdcRound) -> float:
    """Seconds from ENABLE until the subscription's slot confirmed the source's flushed WAL."""
    bench.launcher_rested(cdc_round.sub_url)
    started = time.monotonic()
    with psycopg.connect(cdc_round.sub_url, autocommit=True) as conn:
        conn.execute("ALTER SUBSCRIPTION bench_cdc ENABLE")
    wait_until(
        cdc_round.source_url,
        "SELECT confirmed_flush_lsn >= %s::pg_lsn FROM pg_replication_slots WHERE slot_name = %s",
        "the subscription catching up",
        (cdc_round.target, cdc_round.name),
    )
    return time.monotonic() - started


def _cdc_teardown(bench: Bench, cdc_round: CdcRound) -> None:
    """The subscription, every slot of the round's source database, its databases."""
    if cdc_round.sub_url:
        with (
            contextlib.suppress(psycopg.Error),
            psycopg.connect(cdc_round.sub_url, autocommit=True) as conn,
        ):
            conn.execute("ALTER SUBSCRIPTION bench_cdc DISABLE")
            conn.execute("ALTER SUBSCRIPTION bench_cdc SET (slot_name = NONE)")
            conn.execute("DROP SUBSCRIPTION bench_cdc")
    if cdc_round.source_url:
        wait_until(
            bench.source.url(),
            "SELECT NOT EXISTS (SELECT FROM pg_replication_slots WHERE database = %s AND active)",
            "the round's slots let go",
            (cdc_round.name,),
            timeout=60,
        )
        with psycopg.connect(bench.source.url(), autocommit=True) as conn:
            conn.execute(
                "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots "
                "WHERE database = %s",
                (cdc_round.name,),
            )
    bench.drop_database(bench.dest, f"{cdc_round.name}_sub")
    bench.drop_database(bench.dest, f"{cdc_round.name}_ours")
    bench.drop_database(bench.dest, f"{cdc_round.name}_helped")
    bench.drop_database(bench.source, cdc_round.name)


# ----------------------------------------------------------------------------- report


def report(title: str, tools: list[Tool]) -> None:
    """A markdown table: each run, the median, the ratio to the fastest exact tool."""
    medians = {t.name: statistics.median(t.runs) for t in tools if t.runs}
    exact = [medians[t.name] for t in tools if t.runs and t.usable and t.exact]
    fastest = min(exact) if exact else None
    print(f"\n### {title}\n")
    print("| tool | wall s (each run) | median | / fastest exact | exact | notes |")
    print("|---|---|---|---|---|---|")
    for tool in tools:
        print("| " + " | ".join(cell.replace("|", "\\|") for cell in _cells(tool, fastest)) + " |")


def _cells(tool: Tool, fastest: float | None) -> list[str]:
    notes = list(tool.notes)
    notes += [f"{k}: {', '.join(f'{s:.2f}' for s in v)} s" for k, v in tool.extra.items()]
    if tool.peaks:
        notes.append(f"peak RSS {', '.join(f'{mb:,.0f}' for mb in tool.peaks)} MB")
    if not tool.runs:
        return [tool.name, "-", "-", "-", tool.status or "no run", "; ".join(notes)]
    median = statistics.median(tool.runs)
    if tool.status:
        notes.append(tool.status)
    ratio = f"{median / fastest:.2f}x" if fastest else "-"
    verdict = "failed" if tool.status else ("yes" if tool.exact else "NOT EXACT")
    runs = ", ".join(f"{s:.2f}" for s in tool.runs)
    return [tool.name, runs, f"{median:.2f}", ratio, verdict, "; ".join(notes)]


# ----------------------------------------------------------------------------- main


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt  # SIGTERM tears down like Ctrl-C


def arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=5_000_000)
    parser.add_argument("--changes", type=int, default=1_000_000, help="cdc: log changes")
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--workloads", default=",".join(WORKLOADS), help="comma-separated")
    parser.add_argument("--skip", default="", help="peers to leave out: sling,pgcopydb,reladiff")
    parser.add_argument("--no-install", action="store_true", help="use only what is installed")
    args = parser.parse_args()
    args.workloads = {w.strip() for w in args.workloads.split(",") if w.strip()}
    args.skip = {p.strip() for p in args.skip.split(",") if p.strip()}
    if unknown := args.workloads - set(WORKLOADS):
        parser.error(f"unknown workloads {sorted(unknown)}: pick from {','.join(WORKLOADS)}")
    if unknown := args.skip - set(PEERS):
        parser.error(f"unknown peers {sorted(unknown)}: pick from {','.join(PEERS)}")
    if args.rows < 100_000 or args.repeat < 1 or args.changes < 1:
        parser.error("--rows must be at least 100000, --repeat and --changes at least 1")
    return args


def run_workloads(bench: Bench, tables: list[tuple[str, list[Tool]]]) -> None:
    """Each chosen workload in the fixed order (verify before incremental changes the source)."""
    rows, selected = bench.args.rows, bench.args.workloads
    if selected & {"full", "verify", "incremental"}:
        print(f"building {rows:,} rows ...", flush=True)
        build_source(bench.source.url(), rows)
    titles = {
        "full": f"Full load of {rows:,} rows into an empty destination",
        "verify": f"Verify {rows:,} rows, 0.01% of the copy damaged",
        "incremental": f"1% of {rows:,} rows updated and 0.2% inserted, caught up",
    }
    runners = {"full": full_load, "verify": verify_workload, "incremental": incremental}
    for workload in WORKLOADS:
        if workload not in selected:
            continue
        try:
            if workload == "cdc":
                tables.extend(cdc_workload(bench))
                print(PGCOPYDB_FOLLOW, flush=True)
            else:
                tables.append((titles[workload], runners[workload](bench)))
        except (ToolFailed, psycopg.Error, OSError) as exc:
            print(f"workload {workload} failed: {exc}", flush=True)


def main() -> None:
    args = arguments()
    signal.signal(signal.SIGTERM, _interrupt)
    peers = find_peers(args.skip, not args.no_install)
    for name in PEERS:
        print(f"{name}: {peers.versions.get(name) or peers.missing.get(name)}", flush=True)
    base = Path(tempfile.mkdtemp(prefix="replicator-bench-peers-"))
    bench = Bench(args, base, peers)
    tables: list[tuple[str, list[Tool]]] = []
    try:
        bench.source.start()
        bench.dest.start()
        run_workloads(bench, tables)
    finally:
        bench.source.destroy()
        bench.dest.destroy()
        shutil.rmtree(base, ignore_errors=True)
        print(
            f"\n{os.cpu_count()} cores; {', '.join(f'{k} {v}' for k, v in peers.versions.items())}"
        )
        for title, tools in tables:
            report(title, tools)
        if "cdc" in args.workloads:
            print(f"\n{PGCOPYDB_FOLLOW}")


if __name__ == "__main__":
    try:
        main()
    except KeyboardInterrupt:
        sys.exit(130)  # the clusters are gone and the figures so far printed
