"""Soak: an application writes to the source while cron syncs every couple of seconds and some
of those syncs are killed (SIGKILL at random moments or at a random failpoint). When the
writers stop and two more syncs run, the destination equals the source: nothing lost,
duplicated or stale.

REPLICATOR_SOAK_SECONDS sets how long the writers run (30 by default; `make soak` runs 600)
and REPLICATOR_SOAK_SEED the random choices (printed, so a failing run can be replayed);
REPLICATOR_SOAK_SPARK_EVERY=1 sends every sync through Spark (default: every fifth).
"""

from __future__ import annotations

import json
import os
import random
import threading
import time
from collections import Counter
from pathlib import Path

import pytest
from dbcompare import leftovers
from failpoint_paths import (
    CAPTURE_POINTS,
    DELETE_POINTS,
    EXECUTOR_POINTS,
    FULL_RELOAD_POINTS,
    GENERAL_BATCH_POINTS,
    INCREMENTAL_POINTS,
    RESUME_POINTS,
)
from soak_workload import (
    SyncLog,
    Writer,
    compare,
    create_source,
    reap_session,
    run_killable_sync,
    sync_command,
)

from replicator.base.identifiers import TableName

pytestmark = pytest.mark.spark

WRITERS = 4
WORKER_KILLED = "Spark task failed: Python worker exited unexpectedly"
ROWS = 10_000
TABLES = ("accounts", "events", "wallets")


def _one_sync(
    project: Path, env: dict[str, str], rng: random.Random, log: SyncLog, must_kill: bool = False
) -> None:
    """A cron run: every fifth moves its rows through Spark and every tenth follows a refresh
    (a full reload under load). About one in four is killed at a random moment within the
    time such a run last took, and one in six at a random failpoint of the path it takes;
    half of the in-process refreshes are killed between two partitions of their loads.
    `must_kill`: killed early in the time such a run took (a soak too short, on a slow
    machine, to have had a kill by chance)."""
    log.runs += 1
    spark_every = int(os.environ.get("REPLICATOR_SOAK_SPARK_EVERY", "5"))
    run_env, spark, refresh = dict(env), log.runs % spark_every == 0, log.runs % 10 == 7
    if spark:
        run_env["REPLICATOR_SPARK_MIN_ROWS"] = "0"
        log.spark_runs += 1
    if refresh:
        refreshed = run_killable_sync(sync_command(project, "refresh", *TABLES), env, None)
        assert refreshed.returncode == 0, refreshed.stderr
        log.refreshes += 1
    roll, kill_after, point = rng.random(), None, None
    if must_kill:
        kill_after = rng.uniform(0.05, 0.3) * log.typical_seconds[spark]
    elif refresh and not spark and roll < 0.5:  # a load killed in its middle: the next resumes
        point = rng.choice(RESUME_POINTS)
        run_env["REPLICATOR_FAILPOINT"] = point
    elif roll < 0.25:
        kill_after = rng.uniform(0.1, 0.95) * log.typical_seconds[spark]
    elif roll < 0.42:
        point = rng.choice(
            FULL_RELOAD_POINTS
            if refresh
            else INCREMENTAL_POINTS + GENERAL_BATCH_POINTS + DELETE_POINTS + CAPTURE_POINTS
        )
        run_env["REPLICATOR_FAILPOINT"] = point
    started = time.monotonic()
    done = run_killable_sync(sync_command(project, "sync"), run_env, kill_after)
    log.orphans += reap_session(done.session)
    task_killed = spark and point in EXECUTOR_POINTS
    if done.returncode == -9 and point:
        log.killed_at_failpoint[point] += 1
    elif task_killed and done.returncode == 1 and WORKER_KILLED in done.stderr:
        log.killed_at_failpoint[f"{point} (Spark task)"] += 1
    elif done.returncode == -9:
        log.killed_at_random += 1
    elif done.returncode == 0:
        log.completed += 1
        log.resumed += done.stderr.count("resuming the load:")
        log.typical_seconds[spark] = time.monotonic() - started
        log.failpoint_not_reached += point is not None
    else:
        errors = [line for line in done.stderr.splitlines() if " error " in line]
        log.failures.append(f"run {log.runs} exit {done.returncode}: " + "\n".join(errors))


def test_soak_converges_with_nothing_lost_duplicated_or_stale(
    cdc_project, pg_servers, source_conn, dest_conn, schema
):
    db_project = cdc_project
    seconds = float(os.environ.get("REPLICATOR_SOAK_SECONDS", "30"))
    seed = int(os.environ.get("REPLICATOR_SOAK_SEED", str(random.randrange(1 << 30))))
    print(f"\nsoak: {seconds:.0f} s, seed {seed}")
    rng = random.Random(seed)
    create_source(source_conn, schema, ROWS)
    db_project.write_config(
        {
            "tables": [
                {
                    "name": f"{schema}.accounts",
                    "replication_key": "updated_at",
                    "deletes": "delete",
                    "partitions": 4,  # a killed full load resumes
                },
                {
                    "name": f"{schema}.events",
                    "replication_key": "id",
                    "mode": "incremental-append",
                    "partitions": 4,
                },
                {"name": f"{schema}.wallets", "mode": "cdc"},
            ]
        }
    )
    env = {**os.environ, **db_project.env}
    env.pop("REPLICATOR_SPARK_MIN_ROWS", None)  # the default: small batches skip the JVM
    first = run_killable_sync(sync_command(db_project.path, "sync"), env, None)
    assert first.returncode == 0, first.stderr

    stop, log = threading.Event(), SyncLog()
    writers = [Writer(pg_servers.source_url, schema, stop, seed + i) for i in range(WRITERS)]
    for writer in writers:
        writer.start()
    try:
        deadline, late_runs = time.monotonic() + seconds, 0
        while True:
            # Past the deadline, runs that are killed early go on (at most 5) until one was:
            # how many runs fit in the soak depends on the machine, a kill must not.
            late = time.monotonic() >= deadline
            if late and (log.kills > 0 or late_runs == 5):
                break
            _one_sync(db_project.path, env, rng, log, must_kill=late)
            late_runs += late
            time.sleep(rng.uniform(0.5, 2.0))
    finally:
        stop.set()
        for writer in writers:
            writer.join(timeout=30)
    assert [w.error for w in writers] == [None] * WRITERS
    for _ in range(2):
        final = run_killable_sync(sync_command(db_project.path, "sync"), env, None)
        assert final.returncode == 0, final.stderr

    results = {t: compare(source_conn, dest_conn, schema, t) for t in TABLES}
    report = {
        "seed": seed,
        "seconds": seconds,
        "writers": WRITERS,
        "committed": dict(sum((w.stats.committed for w in writers), Counter())),
        "rolled_back": sum(w.stats.rolled_back for w in writers),
        "held_open_2_to_10s": sum(w.stats.held_open for w in writers),
        "lock_conflicts": sum(w.stats.conflicts for w in writers),
        "syncs": log.runs,
        "completed": log.completed,
        "spark_runs": log.spark_runs,
        "refreshes": log.refreshes,
        "resumed_loads": log.resumed,
        "killed_at_random": log.killed_at_random,
        "killed_at_failpoint": dict(log.killed_at_failpoint),
        "failpoint_not_reached": log.failpoint_not_reached,
        "orphan_processes": len(log.orphans),
        "tables": {t: vars(c) for t, c in results.items()},
    }
    print("soak report: " + json.dumps(report, indent=2))
    print("\n".join(log.failures))
    assert log.failures == []
    for table, result in results.items():
        assert (result.lost, result.duplicated, result.stale, result.extra) == (0, 0, 0, 0), table
    assert results["accounts"].source_rows >= ROWS
    assert log.kills > 0
    assert log.orphans == []
    assert leftovers(dest_conn, [TableName(schema, t) for t in TABLES]) == []
