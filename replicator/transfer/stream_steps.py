"""What `compile` prints for a batch copied in parts (copy_stream.stream_in_parts): the
statements in the order the copy runs them."""

from __future__ import annotations

from ..postgres.database import Step
from ..postgres.snapshot import BOUNDED_LOCK_WAIT
from .copy_stream import CHECK_CLIENT, SOURCE_BEGIN, CopyTask, snapshot_step


def stream_steps(tasks: list[CopyTask], source_version: int) -> list[Step]:
    """What `stream_in_parts` runs, as `compile` prints it: one COPY out of the source, its
    rows into each task's table in a destination transaction of its own."""
    first = tasks[0]
    check = [Step("source", CHECK_CLIENT)] if source_version >= 140000 else []
    parts = [
        step
        for task in tasks
        for step in (
            Step("destination", "BEGIN"),
            Step("destination", task.copy_in),
            Step("destination", "COMMIT"),
        )
    ]
    return [
        *check,
        Step("source", SOURCE_BEGIN),
        snapshot_step(first),
        Step("source", BOUNDED_LOCK_WAIT),
        Step("source", first.copy_out),
        *parts,
        Step("source", "ROLLBACK"),
    ]
