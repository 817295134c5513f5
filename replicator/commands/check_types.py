"""`check`'s findings about the extensions a table's types belong to (citext, hstore...):
the ones the destination lacks, and whether the first sync can create them."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import psycopg

from ..base.errors import ReplicatorError
from ..plan.inspect_table import inspect_table
from ..postgres.dest_extensions import extension_needs
from ..postgres.type_closure import read_closure
from ..project.config import TableConfig
from ..project.project import Project
from .findings import Finding


def extension_findings(
    source: psycopg.Connection[Any],
    dest: psycopg.Connection[Any],
    table: TableConfig,
    project: Project,
) -> Iterator[Finding]:
    """One finding per extension the destination lacks: ok when the sync creates it, an
    error with the statement for a DBA when it cannot. Problems reading the table were
    reported by the table's own checks."""
    try:
        built = inspect_table(source, table, project.templates)
    except ReplicatorError:
        return
    used = read_closure(source, [(c.name, c.type_oid) for c in built.columns])
    for need in extension_needs(dest, used):
        if need.problem is None:
            yield Finding(
                "ok",
                table.written_name,
                f"extension {need.extension} will be created by the first sync "
                f"({need.statement_text}): {need.lacking}",
            )
        else:
            yield Finding("error", table.written_name, f"{need.lacking}; {need.problem}", need.fix)
