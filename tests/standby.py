"""A hot standby of a test server, for the tests of a sync that reads a replica."""

from __future__ import annotations

import contextlib
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psycopg
from psycopg.conninfo import conninfo_to_dict
from waiting import wait_for

from replicator.postgres.pgcluster import PgCluster


@dataclass(frozen=True)
class Standby:
    url: str
    primary_url: str

    def caught_up(self, seconds: float = 60) -> None:
        """Wait until the standby has replayed everything the primary wrote until now."""
        with psycopg.connect(self.primary_url, autocommit=True) as primary:
            (target,) = primary.execute("SELECT pg_current_wal_insert_lsn()").fetchone()
        with psycopg.connect(self.url, autocommit=True) as standby:
            wait_for(
                lambda: standby.execute(
                    "SELECT pg_last_wal_replay_lsn() >= %s::pg_lsn", (target,)
                ).fetchone()[0],
                seconds,
                "the standby to replay the primary's WAL",
            )


@contextlib.contextmanager
def start_standby(primary_url: str) -> Iterator[Standby]:
    base = Path(tempfile.mkdtemp(prefix="replicator-test-standby-"))
    cluster = PgCluster(base / "standby", logical=True)
    try:
        cluster.start_standby(int(conninfo_to_dict(primary_url)["port"]))
        yield Standby(cluster.url(), primary_url)
    finally:
        cluster.destroy()
        shutil.rmtree(base, ignore_errors=True)
