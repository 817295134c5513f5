"""A `cdc` table's reload killed before its swap leaves its side table (a full load in the
`_replicator` schema): no `cdc` load resumes, and the copy goes on from the log, so nothing
would drop it until the table's next reload. The drain drops it, holding the table's lock
(another run's load of the table would hold it too)."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import psycopg

from ...base.identifiers import INTERNAL_SCHEMA
from ...postgres import ddl
from ...postgres.catalog import taken_names
from ...postgres.database import execute
from ..context import TableJob
from ..scripts import side_table

log = logging.getLogger("replicator.sync")


def drop_leftover_sides(dest: psycopg.Connection[Any], jobs: Sequence[TableJob]) -> None:
    """Drop the side tables these (locked) `cdc` tables' killed reloads left."""
    sides = {side_table(job.table.target).name: job for job in jobs}
    if not sides:
        return
    for name in sorted(taken_names(dest, INTERNAL_SCHEMA, list(sides))):
        execute(dest, ddl.drop_table(side_table(sides[name].table.target)))
        log.info(
            "%s: dropped the side table a reload killed before its swap left (%s.%s)",
            sides[name].name,
            INTERNAL_SCHEMA,
            name,
        )
