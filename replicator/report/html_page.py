"""`replicator report`'s page: one self-contained HTML file from `_replicator.runs`.

Per table its last status, lag over its last runs (a sparkline), rows and seconds per run
(bars), and below, every failure of those runs with its reason. Rendered by jinja2 with
autoescape on: table names, reasons and errors are data, never markup. Inline CSS and SVG
only: the page makes no request (no script, font or image from anywhere).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from importlib import resources

import jinja2
from markupsafe import Markup, escape

from .charts import HEIGHT, WIDTH, Bar, Line, bars, sparkline
from .history_rows import RunRow

TEMPLATE = "report.html.j2"


@dataclass(frozen=True)
class TableView:
    """One table's line of the page."""

    name: str
    destination: str
    runs: list[RunRow]  # oldest first
    lag: Line
    rows: list[Bar]
    seconds: list[Bar]

    @property
    def last(self) -> RunRow | None:
        return self.runs[-1] if self.runs else None

    @property
    def succeeded(self) -> int:
        return sum(run.status == "success" for run in self.runs)


def table_view(name: str, destination: str, newest_first: Sequence[RunRow]) -> TableView:
    runs = list(reversed(newest_first))
    statuses = [run.status for run in runs]
    return TableView(
        name,
        destination,
        runs,
        sparkline([run.lag_seconds for run in runs], floor=1.0),
        bars([None if r.rows is None else float(r.rows) for r in runs], statuses, "rows"),
        bars([run.seconds for run in runs], statuses, "s", floor=1.0),
    )


@dataclass(frozen=True)
class Failure:
    """Consecutive failed (or interrupted) runs of a table with the same error: one line."""

    first: RunRow
    last: RunRow
    count: int


def failures(views: Sequence[TableView]) -> list[Failure]:
    """Every table's failures, streaks of the same error folded, the latest first."""
    found: list[Failure] = []
    for view in views:
        streak: list[RunRow] = []
        for run in [*view.runs, None]:
            failed = run is not None and run.status in ("failed", "interrupted")
            if streak and not (failed and (run.status, run.error) == _what(streak[-1])):
                found.append(Failure(streak[0], streak[-1], len(streak)))
                streak = []
            if failed:
                streak.append(run)
    return sorted(found, key=lambda f: f.last.started_at, reverse=True)


def _what(run: RunRow) -> tuple[str, str | None]:
    return run.status, run.error


def render(title: str, generated_at: datetime, views: Sequence[TableView], per_table: int) -> str:
    """The page's HTML."""
    failing = [v for v in views if v.last is not None and v.last.status != "success"]
    source = resources.files("replicator.report").joinpath("templates", TEMPLATE)
    environment = jinja2.Environment(autoescape=True, undefined=jinja2.StrictUndefined)
    environment.filters["when"] = _when
    environment.filters["duration"] = _duration
    environment.filters["breakable"] = _breakable
    template = environment.from_string(source.read_text(encoding="utf-8"))
    return template.render(
        title=title,
        chart_width=int(WIDTH),
        chart_height=int(HEIGHT),
        generated_at=generated_at,
        per_table=per_table,
        views=views,
        failures=failures(views),
        failed_runs=sum(run.status in ("failed", "interrupted") for v in views for run in v.runs),
        failing=failing,
        never=[v for v in views if v.last is None],
    )


def _breakable(name: str) -> Markup:
    """A table name that may wrap after its schema's dot (escaped, then `<wbr>`)."""
    return Markup(".<wbr>").join(escape(part) for part in name.split("."))


def _when(moment: datetime) -> str:
    return moment.astimezone().strftime("%Y-%m-%d %H:%M:%S")


def _duration(seconds: float | None) -> str:
    """`0.4 s`, `12 s`, `3 min 5 s`, `2 h 10 min`; `-` for none."""
    if seconds is None:
        return "-"
    if seconds < 10:
        return f"{seconds:.1f} s"
    whole = round(seconds)
    if whole < 3600:
        minutes, rest = divmod(whole, 60)
        if not minutes:
            return f"{rest} s"
        return f"{minutes} min {rest} s" if rest else f"{minutes} min"
    hours, rest = divmod(whole, 3600)
    return f"{hours} h {rest // 60} min"
