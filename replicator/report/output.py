"""What a person sees during and after a sync: on a TTY a live line per table (rows and bytes
copied, rate, ETA against the planner's estimate, partitions done) and a summary table;
off a TTY (cron) the log lines: one per table, and one every few seconds during a long copy.
`-q` shows neither."""

from __future__ import annotations

import contextlib
import logging
import sys
import threading
import time
from collections.abc import Iterator
from datetime import timedelta
from typing import TYPE_CHECKING

from ..transfer.copy_progress import NO_PROGRESS, Counts, Sink
from .logs import json_output
from .results import TableResult

if TYPE_CHECKING:
    from rich.console import Console
    from rich.progress import Progress

log = logging.getLogger("replicator.sync")


class SyncOutput:
    def __init__(self, always_summarize: bool = False, log_every: float = 10.0) -> None:
        # A live display and a summary table are for people: not under --log-format json.
        self.interactive = sys.stdout.isatty() and not json_output()
        self.always_summarize = always_summarize and not json_output()
        self.log_every = log_every  # seconds between progress lines off a TTY
        self._console: Console | None = None  # rich is imported when first shown

    @property
    def console(self) -> Console:
        if self._console is None:
            from rich.console import Console

            self._console = Console(highlight=False)
        return self._console

    @property
    def quiet(self) -> bool:
        """-q: warnings and errors only, so no progress and no summary table."""
        return not log.isEnabledFor(logging.INFO)

    @contextlib.contextmanager
    def progress(self, name: str) -> Iterator[Sink]:
        """A live display of one table's load on a TTY, log lines otherwise."""
        if self.quiet:
            yield NO_PROGRESS
        elif not self.interactive:
            sink = _LogSink(name, self.log_every)
            try:
                yield sink
            finally:
                sink.close()
        else:
            from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

            with Progress(
                TextColumn("{task.description}"),
                BarColumn(),
                TextColumn("{task.fields[line]}"),
                TimeElapsedColumn(),
                console=self.console,
                transient=True,
            ) as bar:
                yield _LiveSink(bar, bar.add_task(name, total=None, line="starting"))

    def summary(self, results: list[TableResult], skipped: list[str] | None = None) -> None:
        """The run's table; `skipped`: what a run cut short did not start, named at the end."""
        failed = sum(r.status == "failure" for r in results)
        if self.quiet or not (self.interactive or self.always_summarize):
            return
        from rich.markup import escape
        from rich.table import Table

        title = f"sync: {len(results) - failed} succeeded, {failed} failed"
        if skipped:
            title += f", {len(skipped)} skipped (cut short)"
        table = Table(title=title)
        for title in ("table", "action", "rows", "seconds", "reason or error"):
            table.add_column(title, overflow="fold")
        for group in _by_error(results):
            r = group[0]
            if len(group) > 1:  # one error, say a database out of reach: said once
                cells = (some_tables([g.name for g in group]), "-", "-", "-")
            else:
                rows = "-" if r.rows is None else f"{r.rows:,}"
                cells = (r.name, r.action or "-", rows, f"{r.seconds:.1f}")
            table.add_row(
                *map(escape, cells),
                escape(r.reason or "")
                if r.status == "success"
                else f"[red]{escape(r.error or '')}[/red]",
            )
        if skipped:
            table.add_row(escape(some_tables(skipped)), "-", "-", "-", "skipped: cut short")
        self.console.print(table)


def some_tables(names: list[str]) -> str:
    """`4 tables: a, b, c and 1 more`: many tables in one line."""
    more = f" and {len(names) - 3:,} more" if len(names) > 3 else ""
    return f"{len(names):,} tables: {', '.join(names[:3])}{more}"


def _by_error(results: list[TableResult]) -> list[list[TableResult]]:
    """The results in order, failures with the same error text in one group (at the place
    of the first); every other result alone."""
    groups: list[list[TableResult]] = []
    failed: dict[str, list[TableResult]] = {}
    for r in results:
        if r.status == "failure" and r.error in failed:
            failed[r.error].append(r)
            continue
        groups.append([r])
        if r.status == "failure" and r.error is not None:
            failed[r.error] = groups[-1]
    return groups


def describe(counts: Counts) -> str:
    """`1,234,567 of ~5,000,000 rows, 412.3 MB, 98,765 rows/s, ETA 0:00:38, partitions 1/2`"""
    rows = f"{counts.rows:,}"
    if counts.estimated_rows:
        rows += f" of ~{counts.estimated_rows:,}"
    text = f"{rows} rows, {counts.bytes / 1e6:,.1f} MB, {counts.rate:,.0f} rows/s"
    if counts.eta_seconds is not None:
        text += f", ETA {timedelta(seconds=round(counts.eta_seconds))}"
    return f"{text}, partitions {counts.parts_done}/{counts.parts}"


class _LiveSink(Sink):
    active = True

    def __init__(self, bar: Progress, task: object) -> None:
        from rich.markup import escape

        self.bar, self.task, self.escape = bar, task, escape

    def phase(self, text: str) -> None:
        self.bar.update(self.task, line=self.escape(text))

    def update(self, counts: Counts) -> None:
        total = max(counts.estimated_rows or 0, counts.rows) or None
        self.bar.update(
            self.task, completed=counts.rows, total=total, line=self.escape(describe(counts))
        )


class _LogSink(Sink):
    """Off a terminal: a log line every `every` seconds while a copy runs, and while any
    other step of a load takes longer than that (which step, for how long so far); nothing
    for a load shorter than `every`."""

    active = True

    def __init__(self, name: str, every: float) -> None:
        self.name, self.every = name, every
        self.last = time.monotonic()
        self.step, self.step_started = "starting", self.last
        self._stop = threading.Event()
        self._ticker = threading.Thread(target=self._tick, name="progress-log", daemon=True)
        self._ticker.start()

    def close(self) -> None:
        self._stop.set()
        self._ticker.join(timeout=2)

    def phase(self, text: str) -> None:
        self.step, self.step_started = text, time.monotonic()

    def _tick(self) -> None:
        while not self._stop.wait(min(1.0, self.every)):
            now = time.monotonic()
            if self.step == "copying" or now - self.last < self.every:
                continue  # the copy reports its own counts
            self.last = now
            log.info(
                "%s: %s, %.0f s so far",
                self.name,
                self.step,
                now - self.step_started,
                extra={"fields": {"event": "table.progress", "name": self.name, "step": self.step}},
            )

    def update(self, counts: Counts) -> None:
        now = time.monotonic()
        if now - self.last < self.every:
            return
        self.last = now
        log.info(
            "%s: copying: %s",
            self.name,
            describe(counts),
            extra={
                "fields": {
                    "event": "table.progress",
                    "name": self.name,
                    "rows": counts.rows,
                    "bytes": counts.bytes,
                    "estimated_rows": counts.estimated_rows,
                    "partitions_done": counts.parts_done,
                    "partitions": counts.parts,
                    "eta_seconds": (
                        round(counts.eta_seconds) if counts.eta_seconds is not None else None
                    ),
                }
            },
        )
