"""A full load killed part-way resumes: its side table and partition markers stay, and the
next run copies only the partitions still missing, then catches up from the first part's
cursor (docs/architecture.md, "Resumable full loads", gives the argument).

What a resume needs is written to `_replicator.resumable_loads` before the first partition
is copied: the load id, the partitions (page or key ranges, as planned in the first
snapshot), and the cursor, pending transactions and window that snapshot gave. It lives in
the destination beside the side table and the markers it describes, and goes in the same
transaction as the swap. Only cursor tables resume (`incremental-deduped`,
`incremental-append`): the catch-up needs a replication key.
"""

from __future__ import annotations

import hashlib
import json
import logging
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import sql
from psycopg.types.json import Jsonb

from ...base.errors import DatabaseError, TableProblem
from ...base.identifiers import TableName
from ...plan.table_sql import TableSql
from ...postgres import ddl, partition_tree
from ...postgres.catalog import TableInfo
from ...postgres.database import Endpoints, Step, execute, run_steps, transaction
from ...postgres.naming import MARKER_TABLE, RESUME_TABLE
from ...project.state import Cursor, Pending, Window
from ...transfer.leaf_parts import LeafPages, LeafRange
from ...transfer.markers import forget_loads_step
from ...transfer.partitions import KeyRange, PageRange
from ..scripts import side_table

log = logging.getLogger("replicator.sync")

MAX_AGE_DAYS = 7  # an older first snapshot means a long catch-up: start over instead
RESUMABLE_MODES = ("incremental-deduped", "incremental-append")
Part = PageRange | KeyRange | LeafRange


@dataclass(frozen=True)
class Resume:
    """An unfinished load of one table, as its first snapshot planned it."""

    load_id: str
    parts: list[Part]
    cursor: Cursor | None
    pending: Pending | None
    window: Window | None
    shape: str  # shape_of(): columns, types, key and model of the load
    # The source table's storage: a rewrite moves every row's page (a partitioned table:
    # partition_tree.storage_digest of its leaves, which also changes when one comes or goes).
    relfilenode: int

    def as_json(self) -> dict[str, Any]:
        """The record's `plan` column."""
        return {
            "parts": [_part_json(p) for p in self.parts],
            "cursor": self.cursor.model_dump() if self.cursor else None,
            "pending": self.pending.model_dump() if self.pending else None,
            "window": self.window.model_dump() if self.window else None,
            "shape": self.shape,
            "relfilenode": self.relfilenode,
        }

    @classmethod
    def from_json(cls, load_id: str, data: dict[str, Any]) -> Resume:
        """From the record (KeyError, TypeError, ValueError: not this version's)."""
        return cls(
            load_id=load_id,
            parts=[_part(p) for p in data["parts"]],
            cursor=Cursor(**data["cursor"]) if data["cursor"] else None,
            pending=Pending(**data["pending"]) if data["pending"] else None,
            window=Window(**data["window"]) if data["window"] else None,
            shape=data["shape"],
            relfilenode=int(data["relfilenode"]),
        )


def _part_json(part: Part) -> dict[str, Any]:
    if isinstance(part, PageRange):
        return {"pages": [part.first, part.end]}
    if isinstance(part, LeafRange):
        return {"leaves": [[p.leaf.schema, p.leaf.name, p.first, p.end] for p in part.pieces]}
    return {"keys": [part.lower, part.upper], "nulls": part.nulls}


def _part(data: dict[str, Any]) -> Part:
    if "pages" in data:
        return PageRange(*data["pages"])
    if "leaves" in data:
        pieces = (LeafPages(TableName(s, n), first, end) for s, n, first, end in data["leaves"])
        return LeafRange(tuple(pieces))
    return KeyRange(*data["keys"], nulls=bool(data["nulls"]))


def resumable(mode: str | None, replication_key: str | None) -> bool:
    """Whether a table's full load can be resumed at all: it needs a cursor to catch up."""
    return mode in RESUMABLE_MODES and replication_key is not None


def can_resume(built: TableSql, parts: Sequence[Part]) -> bool:
    """Page ranges resume only where every change gives a row a new replication key
    (`incremental-deduped`'s contract): an UPDATE can move a row from a page not yet copied
    to one copied already, and only the catch-up can bring it back. An append table's
    updates keep their key, so its page-range loads start over (leaf parts are page ranges
    too: a row also moves between leaves when its partition key changes)."""
    return built.table.mode == "incremental-deduped" or isinstance(parts[0], KeyRange)


def shape_of(built: TableSql) -> str:
    """What must not change between the parts of one load (and its catch-up)."""
    key = built.table.replication_key
    facts = [
        [(c.name, c.type) for c in built.destination_columns],
        list(built.primary_key),
        built.model.sql,
        [built.table.mode, key, built.type_of(key or "")],
    ]
    return hashlib.sha256(json.dumps(facts).encode()).hexdigest()[:32]


def relfilenode(conn: psycopg.Connection[Any], source: TableInfo) -> int:
    """The source table's storage file: TRUNCATE, VACUUM FULL and CLUSTER give it a new one
    (0 for a view or a model over several tables). A partitioned table's leaves, each with
    its own storage, in one number: a leaf attached, detached or rewritten changes it (a
    leaf attached between two snapshots would hold rows behind the catch-up's cursor)."""
    if source.kind == partition_tree.PARTITIONED:
        return partition_tree.storage_digest(partition_tree.leaves(conn, source.oid))
    (node,) = execute(
        conn, "SELECT relfilenode FROM pg_catalog.pg_class WHERE oid = %s", (source.oid,)
    ).fetchone()
    return int(node)


def record_step(target: TableName, load_id: str, plan: dict[str, Any]) -> Step:
    """Note the load as resumable, before its first partition is copied (`plan`: what
    Resume.as_json gives; `compile` shows placeholders)."""
    return Step(
        "destination",
        sql.SQL(
            "INSERT INTO {} (target, load_id, plan) VALUES (%s, %s, %s) ON CONFLICT (target) "
            "DO UPDATE SET load_id = excluded.load_id, plan = excluded.plan, started_at = now()"
        ).format(RESUME_TABLE.identifier()),
        (target.sql(), load_id, Jsonb(plan)),
    )


def forget_step(target: TableName) -> Step:
    """The table's unfinished load is over (swapped in, dropped, or started over)."""
    return Step(
        "destination",
        sql.SQL("DELETE FROM {} WHERE target = %s").format(RESUME_TABLE.identifier()),
        (target.sql(),),
    )


@dataclass(frozen=True)
class Found:
    """A table's unfinished load and how far it got."""

    resume: Resume
    loaded: frozenset[int]  # partitions committed
    age_days: float


def find(dest: psycopg.Connection[Any], target: TableName) -> Found | None:
    """The table's unfinished load, if one is recorded (and `_replicator` has the table)."""
    with transaction(dest):
        (exists,) = execute(
            dest, "SELECT to_regclass(%s) IS NOT NULL", (RESUME_TABLE.sql(),)
        ).fetchone()
        if not exists:
            return None
        row = execute(
            dest,
            sql.SQL(
                "SELECT load_id, plan, extract(epoch FROM now() - started_at) / 86400 "
                "FROM {} WHERE target = %s"
            ).format(RESUME_TABLE.identifier()),
            (target.sql(),),
        ).fetchone()
        if row is None:
            return None
        parts = execute(
            dest,
            sql.SQL("SELECT part FROM {} WHERE load_id = %s").format(MARKER_TABLE.identifier()),
            (row[0],),
        ).fetchall()
    try:
        resume = Resume.from_json(row[0], row[1])
    except (KeyError, TypeError, ValueError):  # not what this version writes: start over
        log.debug("%s: unreadable resumable load record, ignored", target)
        return None
    return Found(resume, frozenset(p for (p,) in parts), float(row[2]))


def why_not(found: Found, built: TableSql, source_node: int, side_exists: bool) -> str | None:
    """Why this unfinished load cannot be resumed (None: it can)."""
    if not side_exists:
        return "its side table is gone"
    if found.age_days > MAX_AGE_DAYS:
        return f"its first part is {found.age_days:.0f} days old (more than {MAX_AGE_DAYS})"
    if found.resume.shape != shape_of(built):
        return "the source or its model changed shape since"
    if found.resume.relfilenode != source_node:
        return (
            "the source table was rewritten since (TRUNCATE, VACUUM FULL, CLUSTER; or a "
            "partition attached, detached or rewritten)"
        )
    return None


def usable(ends: Endpoints, built: TableSql, source: TableInfo, fresh: bool) -> Found | None:
    """The table's unfinished load when this run can resume it. Else None, said why, with
    the record and markers already gone: a run killed while it starts over must not leave
    them beside a side table emptied meanwhile."""
    found = find(ends.dest, built.table.target)
    if found is None:
        return None
    reason = (
        "sync --full-refresh was given"
        if fresh
        else _why_not_now(ends.source, ends.dest, built, source, found)
    )
    if reason is None:
        return found
    run_steps(ends.dest, start_over_steps(built.table.target))
    log.info(
        "%s: not resuming the unfinished load (%d of %d partitions loaded): %s; starting over",
        built.table.written_name,
        len(found.loaded),
        len(found.resume.parts),
        reason,
    )
    return None


def _why_not_now(
    source_conn: psycopg.Connection[Any],
    dest: psycopg.Connection[Any],
    built: TableSql,
    source: TableInfo,
    found: Found,
) -> str | None:
    side = side_table(built.table.target)
    (side_exists,) = execute(dest, "SELECT to_regclass(%s) IS NOT NULL", (side.sql(),)).fetchone()
    return why_not(found, built, relfilenode(source_conn, source), side_exists)


def outlook(
    source_conn: psycopg.Connection[Any],
    dest: psycopg.Connection[Any],
    built: TableSql,
    source: TableInfo,
) -> tuple[Found, str | None] | None:
    """For `status` and `compile`: the unfinished load, and why the next sync would start
    over instead (None: it resumes). A table without a record costs no statement: the
    records are read once for all tables (`unfinished_targets`)."""
    if built.table.target.sql() not in unfinished_targets(dest):
        return None
    found = find(dest, built.table.target)
    if found is None:
        return None
    return found, _why_not_now(source_conn, dest, built, source, found)


def check_unchanged(
    conn: psycopg.Connection[Any], source: TableInfo, found: Found, name: str
) -> None:
    """Inside the resuming run's snapshot: the source was not rewritten since usable()
    looked (the table fails, keeping its load; the next run starts over)."""
    if relfilenode(conn, source) != found.resume.relfilenode:
        raise TableProblem(
            f"{name}: the source table was rewritten while the load resumed; "
            "the next sync starts it over"
        )


def kept(
    dest: psycopg.Connection[Any], built: TableSql, load_id: str, *, unusable: bool = False
) -> bool:
    """After a failed or interrupted resumable load: keep it when a partition is in. Not
    one whose copied rows cannot take the key (`unusable`: a NULL in it): a resumed load
    would copy nothing new and fail the same way on the rows it kept, even once the source
    is fixed."""
    try:
        found = find(dest, built.table.target)
    except (DatabaseError, psycopg.Error):  # the destination is gone too: look next run
        return True
    if found is None or found.resume.load_id != load_id or not found.loaded:
        return False
    if unusable:
        log.info(
            "%s: the rows copied cannot take the key: the next sync starts the load over",
            built.table.written_name,
        )
        return False
    log.info(  # tasks still stopping may commit a partition more: `status` counts them
        "%s: partitions loaded so far (%d of %d) are kept: the next sync resumes the load "
        "(sync --full-refresh starts over)",
        built.table.written_name,
        len(found.loaded),
        len(found.resume.parts),
    )
    return True


def abandon_steps(target: TableName) -> list[Step]:
    """Drop an unfinished reload: its side table, markers and record, in one transaction."""
    return [
        Step("destination", "BEGIN"),
        Step("destination", "SET LOCAL lock_timeout = '10s'"),
        Step("destination", ddl.drop_table(side_table(target))),
        forget_loads_step(target),
        forget_step(target),
        Step("destination", "COMMIT"),
    ]


def start_over_steps(target: TableName) -> list[Step]:
    """What usable() runs before a load that will not resume an unfinished one."""
    return [
        Step("destination", "BEGIN"),
        forget_loads_step(target),
        forget_step(target),
        Step("destination", "COMMIT"),
    ]


# By destination session: the tables with an unfinished load when the run first looked,
# read once for all of them (a table's own record changes only while it is synced, and a
# table is abandoned before anything of its own runs).
_unfinished: weakref.WeakKeyDictionary[Any, frozenset[str]] = weakref.WeakKeyDictionary()


def unfinished_targets(dest: psycopg.Connection[Any]) -> frozenset[str]:
    """The destination tables with an unfinished load when the run first looked."""
    if dest not in _unfinished:
        with transaction(dest):
            (exists,) = execute(
                dest, "SELECT to_regclass(%s) IS NOT NULL", (RESUME_TABLE.sql(),)
            ).fetchone()
            rows = (
                execute(
                    dest, sql.SQL("SELECT target FROM {}").format(RESUME_TABLE.identifier())
                ).fetchall()
                if exists
                else []
            )
        _unfinished[dest] = frozenset(row[0] for row in rows)
    return _unfinished[dest]


def abandon(dest: psycopg.Connection[Any], target: TableName, name: str) -> None:
    """A table that goes on incrementally drops an unfinished reload (a killed `sync -f`)."""
    if target.sql() not in unfinished_targets(dest):
        return
    found = find(dest, target)
    if found is None:
        return
    run_steps(dest, abandon_steps(target))
    log.info(
        "%s: dropped an unfinished reload (%d of %d partitions loaded): the table goes on "
        "incrementally",
        name,
        len(found.loaded),
        len(found.resume.parts),
    )
