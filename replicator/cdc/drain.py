"""One run's reading of the slot: every change committed before the drain started, streamed
once (cdc/source/log_stream.py) and read to the end (cdc/read.py), in batches of about
BATCH_CHANGES messages:
1. decode and stage each batch, handing it to the applier (cdc/apply/applier.py), which
   applies each table in its own destination transaction that records the position, while
   the next batch is read;
2. each time a batch is applied, confirm its end to the slot, or only up to the first
   transaction a table could not take (it failed... or was not selected this run): that
   table reads it again next run, and the tables that took it skip it by their positions.
   The stream goes on past such a hold: the slot stays at it for the rest of the drain.
A crash between 1 and 2 re-reads the changes next run and applies nothing twice. The
stream never waits for the applies to catch up before the slot moves: confirming is a
message on the stream, sent between two batches.
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import threading
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import psycopg

from ..base.errors import ReplicatorError
from ..base.failpoints import failpoint, pause_point
from ..postgres.database import connect_all, execute, note
from .apply.applier import Applier, forget_drifted
from .capture_table import CaptureTable
from .read import Read, read_changes
from .rows.binary_values import binary_values
from .source.log_stream import LogStream
from .source.slot import advance_slot, lsn_text, slot_info

log = logging.getLogger("replicator.cdc")

BATCH_CHANGES = 200_000  # messages per applied batch: the slot moves after each
RELEASE_WAIT_S = 15
# WAL enough for a table's changes to be made into rows many at once (cdc/rows/copy_block.py,
# whose numpy is a slow import): it is imported beside the drain's start
BLOCK_WAL = 1 << 20


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
    pause_point("cdc-before-drain")
    by_name = {t.name: t for t in tables}
    position = start
    with (
        _imported_beside(upto - start >= BLOCK_WAL),
        _connected(source_url, dest_url) as (source, staging, other_staging),
        ThreadPoolExecutor(1, thread_name_prefix="replicator-apply") as pool,
        ThreadPoolExecutor(1, thread_name_prefix="replicator-copy") as copier,
    ):
        (encoding,) = execute(source, "SHOW server_encoding").fetchone()
        for session in (staging, other_staging):
            execute(session, "SELECT set_config('client_encoding', %s, false)", (encoding,))
        binary = binary_values(source, staging, tables)
        applier = Applier((staging, other_staging), pool, copier, binary=binary)
        stream = LogStream(source_url, slot, publication, upto, encoding, binary=binary)
        applier.ping_while_waiting(stream.ping)

        def advance(read: Read, end: int) -> None:
            """The destination holds every change before `end`: the slot may let them go."""
            nonlocal position
            if read.batches:
                failpoint("cdc-after-apply-before-advance")
            target = end if read.hold is None else min(read.hold, end)
            if target > position:
                stream.confirm(target)
                position = target
            log.debug("cdc: %d change(s) read, slot at %s", read.changes, lsn_text(position))

        try:
            note(source, stream.start(start))
            read = read_changes(
                stream.chunks(),
                applier,
                by_name,
                batch_changes or BATCH_CHANGES,
                lambda read: advance(read, read.applied),
                (start, upto),
            )
            forget_drifted(staging, tables)  # seen after the last batch
            advance(read, max(upto, read.end))  # the stream was read to the drain's end
        finally:
            stream.close()
            if not stream.released:
                with contextlib.suppress(ReplicatorError, psycopg.Error):  # not the run's error
                    _wait_for_the_slot(source, slot)
        if position > start:
            _make_sure_the_slot_moved(source, slot, position)
    for table in tables:
        if table.takes_changes:
            table.position = max(table.position, position)
    return DrainResult(list(tables), start, position, read.batches)


@contextlib.contextmanager
def _connected(source_url: str, dest_url: str) -> Iterator[list[psycopg.Connection[Any]]]:
    """The drain's source session and its two staging sessions, opened at once; closed
    after the block."""
    opened = connect_all((source_url, "source"), *[(dest_url, "destination")] * 2)
    with contextlib.ExitStack() as stack:
        for conn in opened:
            stack.enter_context(conn)
        yield opened


@contextlib.contextmanager
def _imported_beside(needed: bool) -> Iterator[None]:
    """copy_block imported on a thread of its own while the connections open and the stream
    starts (waits that leave the interpreter free), rather than by the reader at the first
    batch's flush, with the destination waiting for that batch; joined at the end, so never
    left running at the process's exit."""
    if not needed:
        yield
        return
    thread = threading.Thread(
        target=importlib.import_module,
        args=("replicator.cdc.rows.copy_block",),
        name="replicator-import",
        daemon=True,
    )
    thread.start()
    try:
        yield
    finally:
        thread.join()


def _wait_for_the_slot(source: psycopg.Connection[Any], slot: str) -> None:
    """A stream cut or lost: its walsender lets go of the slot when it finds the connection
    closed, moments later. Whoever uses the slot next (a drop, `cdc restart`, the next run)
    finds it free."""
    deadline = time.monotonic() + RELEASE_WAIT_S
    while time.monotonic() < deadline:
        info = slot_info(source, slot)
        if info is None or info.active_pid is None:
            return
        time.sleep(0.01)
    log.warning("cdc: replication slot %s still in use %d s after the drain", slot, RELEASE_WAIT_S)


def _make_sure_the_slot_moved(source: psycopg.Connection[Any], slot: str, position: int) -> None:
    """A status update the server never read (a cut stream's walsender reads nothing while
    it sends; a connection the server had just closed takes a write without an error): the
    slot is moved here then, on the source's own session, the stream's walsender gone."""
    info = slot_info(source, slot)
    if info is not None and info.confirmed is not None and info.confirmed < position:
        log.debug("cdc: the stream's last status did not arrive; advancing the slot")
        advance_slot(source, slot, position)
