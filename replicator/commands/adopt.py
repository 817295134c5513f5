"""`replicator adopt T`: hand an existing destination table over to replicator."""

from __future__ import annotations

import logging
from typing import Any

import psycopg

from ..plan.drift import plan_now
from ..postgres.catalog import describe_table
from ..postgres.database import connect
from ..postgres.ownership import classify, read_records, take_ownership
from ..project.config import TableConfig
from ..project.project import Project
from ..project.runlock import run_lock
from ..report.logs import say

log = logging.getLogger(__name__)


def adopt_tables(project: Project, names: tuple[str, ...]) -> int:
    """`replicator adopt`: let replicator replace and update these existing tables."""
    tables = project.select(names)
    project.claim_identity()  # the copies become this project's (project/identity.py)
    connections = project.connections()
    with (
        run_lock(project.state_dir),
        connect(connections.destination, "destination") as dest,
        connect(connections.source, "source") as source,
    ):
        for table in tables:
            say(_adopt(project, source, dest, table), "adopt", name=table.written_name)
    return 0


def _adopt(
    project: Project,
    source: psycopg.Connection[Any],
    dest: psycopg.Connection[Any],
    table: TableConfig,
) -> str:
    info = describe_table(dest, table.target)
    if info is None:
        return (
            f"{table.written_name}: destination table {table.target} does not exist; "
            "nothing to adopt (the next sync creates it)"
        )
    if info.kind != "table":
        return (
            f"{table.written_name}: {table.target} is a {info.kind}, not a table: replicator "
            "cannot replace it; drop it or choose another destination"
        )
    state = project.store.read(table.name)
    ownership = classify(True, read_records(dest, table.target, info.oid), state)
    if ownership == "owned":
        return f"{table.written_name}: {table.target} is already replicator's"
    take_ownership(dest, table)
    if ownership == "taken":
        log.warning(
            "%s: %s was the copy another replicator project kept: it is this project's "
            "now, and that project's syncs of it fail until it is handed back",
            table.written_name,
            table.target,
        )
    plan = plan_now(source, dest, table, project.templates, state).plan
    return (
        f"{table.written_name}: adopted {table.target}; replicator may now replace and update "
        f"it. Next sync: {plan.action} ({plan.reason})"
    )
