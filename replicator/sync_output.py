"""What a person sees during and after a sync: a progress bar and a summary table on a TTY;
off a TTY (cron) only the log lines, one per table."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Iterator

from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from .results import TableResult


class SyncOutput:
    def __init__(self, always_summarize: bool = False) -> None:
        self.interactive = sys.stdout.isatty()
        self.always_summarize = always_summarize
        self.console = Console(highlight=False)

    @contextlib.contextmanager
    def progress(self, name: str) -> Iterator[Callable[[int, int], None] | None]:
        """A transient bar of copied partitions on a TTY; nothing otherwise."""
        if not self.interactive:
            yield None
            return
        with Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("partitions"),
            TimeElapsedColumn(),
            console=self.console,
            transient=True,
        ) as bar:
            task = bar.add_task(name, total=None)

            def update(done: int, total: int) -> None:
                bar.update(task, completed=done, total=total)

            yield update

    def summary(self, results: list[TableResult]) -> None:
        failed = sum(r.status == "failure" for r in results)
        if not (self.interactive or self.always_summarize):
            return
        table = Table(title=f"sync: {len(results) - failed} succeeded, {failed} failed")
        for title in ("table", "action", "rows", "seconds", "reason or error"):
            table.add_column(title, overflow="fold")
        for r in results:
            table.add_row(
                r.name,
                r.action or "-",
                "-" if r.rows is None else f"{r.rows:,}",
                f"{r.seconds:.1f}",
                escape(r.reason or "")
                if r.status == "success"
                else f"[red]{escape(r.error or '')}[/red]",
            )
        self.console.print(table)
