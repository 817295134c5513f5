"""Batches applied on a second thread while the drain reads and stages the next one.

Two destination sessions take turns: a batch is staged into one session's temporary tables
and applied there, while the next batch is staged on the other (a batch's last rows are made
and copied on the copier's thread, Stager.flush_behind, so that the reader goes straight
on). Applies run one at a time, in the order the batches were read (each waits for the one
before), so a table's changes land in commit order and its position only moves forward.
The reading thread spends its time in Python (decoding, COPY fields); the applying one waits
on the destination, so on two cores the two overlap instead of adding up.

A source transaction larger than a batch cannot be cut at a commit: it is applied in parts
(`submit_part`) on its batch's session, in one destination transaction that the batch's last
part commits with the positions (docs/architecture.md, log capture), so its apply overlaps
its own reading too.

A table whose apply fails has its position forgotten (its next run reloads it; the other
tables go on); if even that fails it holds the slot at its first change in the batch: the
applier returns that position to the reader, which keeps the slot from passing it. A table
the log showed changed shape has its position forgotten after each batch too, so the slot
may pass the changes it did not take (`applied_end` says how far that is).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import psycopg
from psycopg import pq

from ...base.errors import ReplicatorError, one_line
from ...base.failpoints import failpoint
from ...base.identifiers import TableName
from ...base.interrupts import raise_if_requested
from ...postgres.database import execute
from ..capture_table import CaptureTable
from ..rows.stage import Stager, wait_for
from ..rows.table_stage import TableStage
from ..source.slot import lsn_text
from .applied import forget_applied, record_applied_step
from .history_apply import Commits
from .table_apply import apply_stage

log = logging.getLogger("replicator.cdc")


@dataclass
class Batch:
    """Whole transactions, staged on one session, applied together."""

    changes: int = 0
    end: int = 0  # the end of its last commit: the tables' position once applied
    first_seen: dict[TableName, int] = field(default_factory=dict)  # first commit per table
    # each transaction's sequence number before its first change, and its commit time: kept
    # when a table keeps history (cdc/apply/history_apply.py)
    transactions: list[tuple[int, datetime]] = field(default_factory=list)


class Applier:
    """Applies staged batches in order, one at a time, beside the reading thread."""

    def __init__(
        self,
        sessions: Sequence[psycopg.Connection[Any]],
        pool: ThreadPoolExecutor,
        copier: ThreadPoolExecutor,
        *,
        binary: bool = False,  # the stream sends binary values (cdc/rows/binary_values.py)
    ):
        self._stagers = [Stager(session, copier, binary=binary) for session in sessions]
        self._turn = 0
        self._pool = pool
        self._pending: Future[int | None] | None = None
        self._pending_end: int | None = None  # the end of the batch being applied
        self.applied_end = 0  # the end of the last batch applied: the slot may pass it

    @property
    def stager(self) -> Stager:
        """Where the batch being read is staged."""
        return self._stagers[self._turn]

    def submit(self, batch: Batch, tables: Sequence[CaptureTable]) -> int | None:
        """Start applying the staged batch (once the one before is applied); returns the hold
        of the one before, if any (see `wait`)."""
        stager = self.stager
        if stager.part_open:  # its session is applying the batch's previous part
            held = self._flush_after_the_apply(stager)
        else:
            stager.flush_behind()  # its rows are made and copied while the reader goes on
            failpoint("cdc-after-stage")
            held = self.wait()
        self._pending = self._pool.submit(_apply_batch, stager, batch, tables)
        self._pending_end = batch.end
        stager.applying = self._pending
        self._turn = (self._turn + 1) % len(self._stagers)
        return held

    def submit_part(self, batch: Batch, tables: Sequence[CaptureTable]) -> int | None:
        """Start applying what is staged of a batch whose transaction goes on: in a
        destination transaction that stays open until the batch's last part (`submit`), on
        the same session, which takes no rows meanwhile (stage.py buffers them)."""
        stager = self.stager
        held = self._flush_after_the_apply(stager)  # the batch before, or this batch's part
        stager.part_open = True
        part = stager.take_part()
        self._pending = self._pool.submit(_apply_part, stager, part, batch, tables)
        stager.applying = self._pending
        return held

    def _flush_after_the_apply(self, stager: Stager) -> int | None:
        """COPY the stager's rows once the apply under way is done (it may hold the same
        session); the rows are made meanwhile. Returns `wait`'s hold."""
        taken = stager.take_copies()
        held = self.wait()
        stager.flush(taken=taken)
        return held

    def wait(self) -> int | None:
        """Wait for the batch being applied; returns the first commit a table that failed and
        could not be forgotten needs again (the slot must not pass it), or None."""
        pending, end = self._pending, self._pending_end
        self._pending = self._pending_end = None
        if pending is None:
            return None
        wait_for(pending, self._stagers[0].ping)
        held = pending.result()
        if end is not None:  # a whole batch, not a part of one
            self.applied_end = end
        return held

    def ping_while_waiting(self, ping: Callable[[], None]) -> None:
        """What to call every few seconds while the reader waits for an apply."""
        for stager in self._stagers:
            stager.ping = ping


def _apply_batch(stager: Stager, batch: Batch, tables: Sequence[CaptureTable]) -> int | None:
    stager.settle()  # its last flush (Stager.flush_behind)
    parted = frozenset(table.name for table in stager.parted)
    applied, hold = _apply_staged(
        stager.dest, stager.stages, batch, tables, record=True, parted=parted
    )
    stager.reset()
    if stager.part_open:  # the transaction the batch's first part opened
        done = {table.name for table in applied}
        for table in stager.parted:  # changed in an earlier part only: its position too
            if table.applies and table.name not in done:
                record = record_applied_step(table.target, table.end_of(batch.end))
                execute(stager.dest, record.statement, record.params)
                applied.append(table)
        execute(stager.dest, "COMMIT")
        stager.part_open = False
        stager.parted = []
    for table in applied:
        table.applied = table.position = table.end_of(batch.end)
    forget_drifted(stager.dest, tables)
    log.debug("cdc: batch of %d change(s), up to %s", batch.changes, lsn_text(batch.end))
    return hold


def forget_drifted(dest: psycopg.Connection[Any], tables: Sequence[CaptureTable]) -> None:
    """A table the log showed changed shape took no changes from there: before the slot
    passes them, its position goes, so that it reloads even if this process dies before
    the run marks it (and the shape changed back meanwhile)."""
    for table in tables:
        if table.drift is not None and not table.forgotten:
            forget_applied(dest, table.target)
            table.forgotten = True


def _apply_part(
    stager: Stager,
    part: Mapping[TableName, TableStage],
    batch: Batch,
    tables: Sequence[CaptureTable],
) -> int | None:
    """A part of a batch: applied in the transaction the batch's last part commits (a crash
    before that commit leaves the destination as it was), its position not recorded. The
    reader is staging the next part into the same stages meanwhile: this works on `part`,
    what they held when it was handed over, and empties the staging tables, which take no
    rows until it is done."""
    if stager.dest.info.transaction_status == pq.TransactionStatus.IDLE:
        execute(stager.dest, "BEGIN")
    parted = frozenset(table.name for table in stager.parted)
    applied, hold = _apply_staged(stager.dest, part, batch, tables, record=False, parted=parted)
    known = {table.name for table in stager.parted}
    stager.parted += [table for table in applied if table.name not in known]
    stager.empty_tables(part.values())  # a stage the reader added since holds no rows yet
    failpoint("cdc-after-part")
    log.debug("cdc: part of a batch, %d change(s) so far", batch.changes)
    return hold


def _apply_staged(
    dest: psycopg.Connection[Any],
    stages: Mapping[TableName, TableStage],
    batch: Batch,
    tables: Sequence[CaptureTable],
    record: bool,
    parted: frozenset[TableName] = frozenset(),
) -> tuple[list[CaptureTable], int | None]:
    """Each table's staged changes; the tables applied and the hold (see Applier.wait).
    `parted`: the tables an earlier part of the batch applied changes of."""
    applied: list[CaptureTable] = []
    hold: int | None = None
    commits = None  # the commit times, for tables that keep history
    if any(t.history is not None for t in tables):
        commits = Commits.of(list(batch.transactions))
    for table in tables:
        raise_if_requested()  # SIGTERM: the tables not applied yet wait for the next run
        if not table.applies:
            continue
        stage = stages.get(table.target)
        if stage is not None and stage.changes:
            held = _apply(dest, table, stage, batch, record, commits, table.name in parted)
            if held is not None:
                hold = held if hold is None else min(hold, held)
            elif table.applies:
                applied.append(table)
    return applied, hold


def _apply(
    dest: psycopg.Connection[Any],
    table: CaptureTable,
    stage: TableStage,
    batch: Batch,
    record: bool = True,
    commits: Commits | None = None,
    parted: bool = False,
) -> int | None:
    """Apply one table's batch (or part: `record` False); returns where it holds the slot
    if it failed and its position could not be forgotten."""
    started, end = time.monotonic(), table.end_of(batch.end)
    try:
        applied = apply_stage(
            dest,
            stage,
            table.key,
            end if record else None,
            table.label,
            keys_may_repeat=table.keys_may_repeat,
            where=table.where,
            history=table.history,
            commits=commits,
            parted=parted,
        )
    except (ReplicatorError, psycopg.Error) as exc:
        raise_if_requested()
        table.error = one_line(exc)
        try:  # its next run reloads it; meanwhile the slot need not keep its changes
            forget_applied(dest, table.target)
            table.forgotten = True
        except (ReplicatorError, psycopg.Error):
            table.holds = True
            return batch.first_seen.get(table.name, end)
        return None
    table.changes += stage.changes
    table.upserted += applied.upserted
    table.deleted += applied.deleted
    table.truncated = table.truncated or applied.truncated
    if applied.versions is not None:
        table.versions += applied.versions
    log.debug(
        "cdc: %s: %d change(s) applied in %.2f s",
        table.label,
        stage.changes,
        time.monotonic() - started,
    )
    return None
