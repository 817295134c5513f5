"""Small inline SVG charts for the HTML report: coordinates computed here (pure, testable),
drawn by the template. No script, no font, no network: the page stands alone."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

WIDTH, HEIGHT, PAD = 120.0, 30.0, 2.0
# A chart has room for at least this many runs: a few runs are as wide as in a full chart,
# the newest always at the right edge.
MIN_SLOTS = 20


@dataclass(frozen=True)
class Bar:
    x: float
    y: float
    width: float
    height: float
    status: str  # the run's status: the bar's colour
    title: str  # shown on hover


@dataclass(frozen=True)
class Line:
    """A sparkline: the polyline's points, its last point (marked), the biggest value."""

    points: str
    last: tuple[float, float] | None
    top: float


def sparkline(values: Sequence[float | None], floor: float = 0.0) -> Line:
    """Values oldest first; a missing value (None) leaves a gap in x, not a dip to zero.
    `floor`: the least top of the scale (a lag of milliseconds stays flat at the bottom)."""
    known = [(i, v) for i, v in enumerate(values) if v is not None]
    top = max([floor, *(v for _, v in known)])
    if not known:
        return Line("", None, 0.0)
    slot, first = _slots(len(values))
    coords = [(first + (i + 0.5) * slot, _y(v, top)) for i, v in known]
    if len(coords) == 1:  # one run: a short flat stroke ending at it
        coords = [(coords[0][0] - slot, coords[0][1]), coords[0]]
    points = " ".join(f"{x:.1f},{y:.1f}" for x, y in coords)
    return Line(points, coords[-1], top)


def bars(
    values: Sequence[float | None], statuses: Sequence[str], unit: str, floor: float = 0.0
) -> list[Bar]:
    """One bar per run, oldest first; a run without a value gets a stub of its colour."""
    slot, first = _slots(len(values))
    width = max(slot * 0.75, 1.0)
    top = max([floor, *(v for v in values if v is not None)])
    found = []
    for i, (value, status) in enumerate(zip(values, statuses, strict=True)):
        y = _y(value or 0.0, top)
        height = max(HEIGHT - PAD - y, 1.0)
        text = "-" if value is None else f"{value:,.1f}".removesuffix(".0")
        found.append(
            Bar(first + i * slot, HEIGHT - PAD - height, width, height, status, f"{text} {unit}")
        )
    return found


def _slots(count: int) -> tuple[float, float]:
    """The width of one run's slot, and where the first of `count` runs starts."""
    slot = (WIDTH - 2 * PAD) / max(count, MIN_SLOTS)
    return slot, WIDTH - PAD - count * slot


def _y(value: float, top: float) -> float:
    if top <= 0:
        return HEIGHT - PAD
    return PAD + (HEIGHT - 2 * PAD) * (1 - value / top)
