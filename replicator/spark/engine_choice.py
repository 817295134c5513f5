"""Which engine moves a copy: Spark, or this process running the same COPY tasks.

Both run the same task code (copy_stream.py), so what differs is Spark's fixed cost (a
JVM to start, or a Connect client and a job on a server) against what its parallel tasks
gain. Neither is a constant: a 2-core machine gains nothing from two tasks (both
PostgreSQL backends already hold its cores), a cluster gains its executors. So, unless
`spark.min_rows` is set (then it is the threshold, as configured), the choice comes from
this host's measurements: every copy of at least `MEASURED_ROWS` rows records its rate
(and, on Spark, what Spark's start cost it: the whole start for the run's first such copy,
even where the run did other work meanwhile) in the cache folder, and a copy goes to Spark
when the predicted time there is shorter than in this process.

Before an engine is measured: copies below `FLOOR` rows never start Spark; a local
master (`local[*]`, the default, also behind the warm server) is tried only where its
tasks can run in parallel on more than two cores and the copy is large enough to show it
(`TRY_LOCAL_ROWS`); a cluster or `spark.remote` is used from `DEFAULT_MIN_ROWS`, as
configured engines were before: its first copies measure it.
"""

from __future__ import annotations

import json
import logging
import os
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from ..base.cache import cache_dir
from ..project.spark_remote import Remote

if TYPE_CHECKING:
    from ..project.settings import Settings

log = logging.getLogger(__name__)

IN_PROCESS = "in-process"
FLOOR = 100_000  # below: a Spark start costs more than the copy (bench/RESULTS.md)
DEFAULT_MIN_ROWS = 500_000  # a configured cluster or server, not measured yet
TRY_LOCAL_ROWS = 2_000_000  # a local master on more than two cores, not measured yet
# Smaller copies are mostly fixed cost (connections, COPY set-up, a warm JVM's job): a
# small copy runs at a fraction of a large one's rate, which would make any engine
# measured on large copies look faster than one measured on small ones.
MEASURED_ROWS = 500_000
_WEIGHT = 0.5  # of a new measurement against the figures so far
_FILE = "engine-figures.json"
_LOCAL = re.compile(r"^local(?:\[(\*|\d+)(?:,\s*\d+)?\])?$")


@dataclass(frozen=True)
class Figure:
    """An engine's measured copy rate and, for Spark, the seconds its start cost a copy."""

    rows_per_second: float
    start_seconds: float = 0.0


def local_slots(master: str | None) -> int | None:
    """The task slots of a local master (None: not a local master)."""
    found = _LOCAL.match(master or "local[*]")
    if found is None:
        return None
    count = found.group(1)
    if count is None:
        return 1
    return (os.cpu_count() or 1) if count == "*" else int(count)


class EngineChoice:
    """The copy engine for a number of rows, from `spark.min_rows` or this host's figures."""

    def __init__(self, where: str, min_rows: int | None, local: int | None):
        self.where = where  # the Spark engine's key: its master, or its server's address
        self.min_rows = min_rows  # set by the user: the threshold, nothing measured
        self.local = local  # a local master's task slots
        self._figures = _read()

    @classmethod
    def of(
        cls,
        master: str | None,
        remote: str | None,
        warm: int | None,
        min_rows: int | None,
    ) -> EngineChoice:
        """The choice for Spark as configured: a local or cluster master, a Connect server
        (`remote`, its URL) or the warm server (`warm`: its task slots), which runs the
        project's master: on a local one it is judged as that master is, without the JVM
        start. The warm server is one engine whatever port it last started on; a Connect
        server is named without its token."""
        if warm is not None:
            local = warm if local_slots(master) is not None else None
            return cls("the warm Spark server", min_rows, local)
        if remote is not None:
            return cls(f"Spark Connect at {Remote.parse(remote)}", min_rows, None)
        return cls(f"Spark ({master or 'local[*]'})", min_rows, local_slots(master))

    @classmethod
    def for_settings(cls, settings: Settings) -> EngineChoice:
        """The choice a run of these settings starts with."""
        server = settings.warm_server
        warm = server.parallelism if server is not None else None
        return cls.of(settings.spark_master, settings.spark_remote, warm, settings.min_rows)

    def spark_for(self, rows: int) -> bool:
        """Whether a copy of about this many rows goes to Spark (else: this process)."""
        if self.min_rows is not None:
            return rows >= self.min_rows
        if rows < FLOOR:
            return False
        spark, here = self._figures.get(self.where), self._figures.get(IN_PROCESS)
        if spark is not None and here is not None:
            there = spark.start_seconds + rows / spark.rows_per_second
            return there < rows / here.rows_per_second
        if self.local is not None:
            return self.local > 2 and rows >= TRY_LOCAL_ROWS
        return rows >= DEFAULT_MIN_ROWS

    def describe(self) -> str:
        """How the choice is made, for `check`, `spark status` and log lines."""
        if self.min_rows is not None:
            return f"from {self.min_rows:,} rows (spark.min_rows)"
        spark, here = self._figures.get(self.where), self._figures.get(IN_PROCESS)
        if spark is not None and here is not None:
            ahead = (
                spark.start_seconds / (1 / here.rows_per_second - 1 / spark.rows_per_second)
                if spark.rows_per_second > here.rows_per_second
                else None
            )
            measured = (
                f"measured here: {spark.rows_per_second:,.0f} rows/s after "
                f"{spark.start_seconds:.1f} s against {here.rows_per_second:,.0f} rows/s "
                "in this process"
            )
            if ahead is None:
                return f"never ({measured})"
            return f"from {max(ahead, FLOOR):,.0f} rows ({measured})"
        if self.local is not None:
            if self.local > 2:
                return f"from {TRY_LOCAL_ROWS:,} rows until measured ({self.local} task slots)"
            return (
                f"never on {self.local} task slots until measured faster (set spark.min_rows "
                "to send copies to Spark)"
            )
        return f"from {DEFAULT_MIN_ROWS:,} rows until measured"

    def record(self, engine: str, rows: int, seconds: float, waited: float = 0.0) -> None:
        """Add one copy's figures (`engine`: IN_PROCESS or `where`); small copies say
        nothing and are left out."""
        if rows < MEASURED_ROWS or seconds <= 0:
            return
        figures = _read()  # another run may have written since this one began
        new = Figure(rows / seconds, waited)
        old = figures.get(engine)
        if old is not None:
            new = Figure(
                old.rows_per_second + _WEIGHT * (new.rows_per_second - old.rows_per_second),
                old.start_seconds + _WEIGHT * (new.start_seconds - old.start_seconds),
            )
        figures[engine] = new
        self._figures = figures
        _write(figures)


def _path() -> Path | None:
    folder = cache_dir()
    return folder / _FILE if folder is not None else None


def _read() -> dict[str, Figure]:
    """The figures; none when the cache is off or the file unreadable (measured again)."""
    path = _path()
    if path is None or not path.exists():
        return {}
    try:
        raw = json.loads(path.read_text())
        return {
            key: Figure(float(value["rows_per_second"]), float(value.get("start_seconds", 0)))
            for key, value in raw.items()
            if float(value["rows_per_second"]) > 0
        }
    except (OSError, ValueError, TypeError, KeyError, AttributeError):
        log.debug("unreadable engine figures in %s: measuring again", path)
        return {}


def _write(figures: dict[str, Figure]) -> None:
    """Replace the file atomically; a cache that cannot be written is only a lost figure."""
    path = _path()
    if path is None:
        return
    data = {key: vars(value) for key, value in figures.items()}
    try:
        with tempfile.NamedTemporaryFile("w", dir=path.parent, delete=False) as handle:
            json.dump(data, handle, indent=1)
        os.replace(handle.name, path)
    except OSError as exc:
        log.debug("engine figures not written (%s)", exc)
