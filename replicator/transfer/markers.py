"""A load's identity in the destination: its id, its partition markers, and what is dropped
when it fails.

Every load (a full reload, an incremental batch) gets a fresh id made of the target's quoted
name and 32 hex digits; each finished copy task records its partition under it, in the
transaction that wrote its rows. The markers of a table's earlier loads, left by a killed
run, are dropped when its next load starts: the table lock it holds means none of them is
still being written.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Sequence
from typing import Any

import psycopg
from psycopg import sql

from ..base.identifiers import TableName
from ..postgres import ddl
from ..postgres.database import Step, execute, fetch_all, run_steps, transaction
from ..postgres.naming import MARKER_TABLE


def load_id_prefix(target: TableName) -> str:
    """How every load id of `target` starts (32 hex digits follow)."""
    return f"{target.sql()} "


def new_load_id(dest: psycopg.Connection[Any], target: TableName) -> str:
    """A fresh id for one load of `target`; the markers of its earlier loads are dropped."""
    forget_loads(dest, target)
    return fresh_load_id(target)


def fresh_load_id(target: TableName) -> str:
    """A new id for a load of `target` (its caller drops the earlier loads' markers)."""
    return load_id_prefix(target) + uuid.uuid4().hex


def forget_loads(dest: psycopg.Connection[Any], target: TableName) -> None:
    """Drop the partition markers of every load of `target` (its table lock is held)."""
    run_steps(dest, [forget_loads_step(target)])


def forget_loads_step(target: TableName) -> Step:
    return Step(
        "destination",
        sql.SQL(
            "DELETE FROM {} WHERE starts_with(load_id, %(prefix)s) "
            "AND length(load_id) = length(%(prefix)s) + 32"
        ).format(MARKER_TABLE.identifier()),
        {"prefix": load_id_prefix(target)},
    )


def forget_markers(dest: psycopg.Connection[Any], load_id: str) -> None:
    """A finished load's partition markers are no longer needed."""
    run_steps(dest, [forget_markers_step(load_id)])


def forget_markers_step(load_id: str) -> Step:
    return Step(
        "destination",
        sql.SQL("DELETE FROM {} WHERE load_id = %s").format(MARKER_TABLE.identifier()),
        (load_id,),
    )


def discard(
    dest: psycopg.Connection[Any],
    target: TableName,
    tables: list[TableName],
    also: Sequence[Step] = (),
) -> None:
    """After a failed or interrupted load: drop the tables it created and its markers (and
    run `also`, its resume record's removal). Best effort, a few seconds at most (a killed
    Spark task may still hold a lock); whatever is left, the table's next load drops first."""
    with contextlib.suppress(Exception), transaction(dest):
        execute(dest, "SET LOCAL lock_timeout = '10s'")
        for table in tables:
            execute(dest, ddl.drop_table(table))
        if fetch_all(dest, "SELECT to_regclass(%s) IS NOT NULL", (MARKER_TABLE.sql(),))[0][0]:
            forget_loads(dest, target)
            run_steps(dest, also)
