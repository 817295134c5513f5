"""One run's reading of the slot: every change committed before the drain started, in
bounded reads, each applied and recorded before the slot lets go of it.

Per read (capture/read.py) of at most READ_BATCHES batches of BATCH_CHANGES messages:
1. decode and stage each batch, handing it to the applier (capture/applier.py), which
   applies each table in its own destination transaction that records the position, while
   the next batch is read;
2. once every batch of the read is applied, advance the slot to the read's end, or only up
   to the first transaction a table could not take (it failed... or was not selected this
   run): that table reads it again next run, and the tables that took it skip it by their
   positions.
A crash between 1 and 2 re-reads the changes next run and applies nothing twice.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import psycopg

from ..base.failpoints import failpoint
from ..base.interrupts import raise_if_requested
from ..postgres.database import connect, execute
from .applied import forget_applied
from .applier import Applier
from .capture_table import CaptureTable
from .lsn import lsn_text
from .read import read_changes
from .slot import advance_slot

log = logging.getLogger("replicator.capture")

BATCH_CHANGES = 200_000  # messages per applied batch
READ_BATCHES = 5  # batches per read of the slot (each read decodes from the slot's position)


@dataclass
class DrainResult:
    tables: list[CaptureTable]
    start: int
    end: int  # the slot's position after the drain
    batches: int


def drain(
    source_url: str,
    dest_url: str,
    slot: str,
    publication: str,
    tables: Sequence[CaptureTable],
    start: int,
    upto: int,
    *,
    batch_changes: int | None = None,
) -> DrainResult:
    """Read, apply and release the slot's changes from `start` (its position) up to `upto`
    (the WAL flushed when the drain began)."""
    by_name = {t.name: t for t in tables}
    per_batch = batch_changes or BATCH_CHANGES
    limit = per_batch * READ_BATCHES
    position, batches = start, 0
    with (
        connect(source_url, "source") as source,
        connect(dest_url, "destination") as staging,
        connect(dest_url, "destination") as other_staging,
        ThreadPoolExecutor(1, thread_name_prefix="replicator-apply") as pool,
        ThreadPoolExecutor(1, thread_name_prefix="replicator-copy") as copier,
    ):
        (encoding,) = execute(source, "SHOW server_encoding").fetchone()
        for session in (staging, other_staging):
            execute(session, "SELECT set_config('client_encoding', %s, false)", (encoding,))
        applier = Applier((staging, other_staging), pool, copier)
        while True:
            raise_if_requested()
            read = read_changes(source, applier, slot, publication, by_name, upto, limit, per_batch)
            batches += read.batches
            _forget_drifted(staging, tables)
            if read.batches:
                failpoint("cdc-after-apply-before-advance")
            target = read.end if read.hold is None else min(read.hold, read.end)
            if read.rows and target > position:
                advance_slot(source, slot, target)
                position = target
            log.debug("cdc: read %d message(s), slot at %s", read.rows, lsn_text(position))
            if read.hold is not None:
                if read.rows < limit:  # read up to `upto`; the held part waits for its table
                    break
                # The slot cannot pass the held change: read further from it, the tables
                # skipping what they already applied (each read starts at the slot).
                limit *= 2
                continue
            if read.rows < limit:  # the slot is read up to `upto`
                if upto > position:
                    advance_slot(source, slot, upto)
                    position = upto
                break
    for table in tables:
        if table.takes_changes:
            table.position = max(table.position, position)
    return DrainResult(list(tables), start, position, batches)


def _forget_drifted(dest: psycopg.Connection[Any], tables: Sequence[CaptureTable]) -> None:
    """A table the log showed changed shape took no changes from there: before the slot
    passes them, its position goes, so that it reloads even if this process dies before
    the run marks it (and the shape changed back meanwhile)."""
    for table in tables:
        if table.drift is not None and not table.forgotten:
            forget_applied(dest, table.target)
            table.forgotten = True
