"""The Prometheus text file (`metrics.textfile`), for node_exporter's textfile collector.

Replaced after every run and every `sync --follow` tick by prometheus_client's
`write_to_textfile`: written under a temporary name in the same folder, then renamed, so the
collector never reads half a file. Every table of the project is in it: one the run did not
sync keeps its last run's values (from sync-state). A file that cannot be written is a
warning; it never changes the run's exit code.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING

from .history_rows import STATUSES, RunRow

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry, Gauge

log = logging.getLogger("replicator.metrics")


@dataclass(frozen=True)
class TableFigures:
    """A table's series: its last run (None: never ran) and its last successful sync."""

    table: str  # the source table, schema.table (the `table` label)
    last: RunRow | None
    last_success: datetime | None


@dataclass(frozen=True)
class RunFigures:
    """The run's own series."""

    finished_at: datetime
    tables_failed: int


def registry_for(
    tables: Sequence[TableFigures], run: RunFigures, slots: Mapping[str, int]
) -> CollectorRegistry:
    """Every series, with the names and labels docs/guides/metrics-and-report.md lists
    (dashboards rely on them). prometheus_client is imported here, by the runs that write
    the file: its import (with http.server and urllib.request) is one a run without
    `metrics.textfile` does not pay."""
    from prometheus_client import CollectorRegistry, Gauge

    registry = CollectorRegistry()

    def gauge(name: str, text: str, labels: Sequence[str] = ()) -> Gauge:
        return Gauge(name, text, labels, registry=registry)

    success = gauge(
        "replicator_table_last_success_timestamp_seconds",
        "When the table's last successful sync ended (Unix time).",
        ["table"],
    )
    status = gauge(
        "replicator_table_last_run_status",
        "The table's last run: 1 for its status, 0 for the others.",
        ["table", "status"],
    )
    lag = gauge(
        "replicator_table_lag_seconds",
        "How stale the copy was as the table's last run ended.",
        ["table"],
    )
    rows = gauge("replicator_table_rows", "Rows the table's last run read.", ["table"])
    duration = gauge(
        "replicator_table_duration_seconds", "How long the table's last run took.", ["table"]
    )
    for figures in tables:
        label = figures.table
        if figures.last_success is not None:
            success.labels(label).set(figures.last_success.timestamp())
        last = figures.last
        if last is None:
            continue
        for name in STATUSES:
            status.labels(label, name).set(1 if last.status == name else 0)
        if last.lag_seconds is not None:
            lag.labels(label).set(last.lag_seconds)
        if last.rows is not None:
            rows.labels(label).set(last.rows)
        duration.labels(label).set(last.seconds)
    gauge("replicator_run_tables_failed", "Tables that failed in the last run.").set(
        run.tables_failed
    )
    gauge("replicator_run_finished_timestamp_seconds", "When the last run ended (Unix time).").set(
        run.finished_at.timestamp()
    )
    retained = gauge(
        "replicator_slot_retained_wal_bytes",
        "WAL the source keeps for the replication slot (pg_current_wal_lsn() - restart_lsn).",
        ["slot"],
    )
    for slot, size in slots.items():
        retained.labels(slot).set(size)
    return registry


def write(path: Path, registry: CollectorRegistry) -> bool:
    """Replace the file atomically; False (and a warning) when it cannot be written."""
    from prometheus_client import write_to_textfile

    try:
        write_to_textfile(str(path), registry)
    except OSError as exc:
        log.warning("the metrics file %s was not written: %s", path, exc)
        return False
    return True
