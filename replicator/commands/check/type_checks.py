"""`check`'s findings about a table's types: the extensions they belong to (citext,
hstore...) that the destination lacks, and whether the first sync can create them; and the
functions and sequences of the user's own its domains use that the destination lacks."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import psycopg

from ...base.errors import ReplicatorError, TableProblem
from ...plan.inspect_table import inspect_table
from ...postgres.database import execute, transaction
from ...postgres.types.dest_extensions import extension_needs
from ...postgres.types.domain_needs import check_domain_needs
from ...postgres.types.type_closure import read_closure
from ...project.config import TableConfig
from ...project.project import Project
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
    problems = []
    with transaction(source):  # (no yield inside: the caller reads on this session)
        execute(source, "SET LOCAL search_path = pg_catalog, pg_temp")  # names qualified
        for t in used:
            if t.kind == "d" and not t.extension:
                try:
                    check_domain_needs(source, dest, t.oid, t.qualified)
                except TableProblem as exc:
                    problems.append(str(exc))
    for problem in problems:
        yield Finding("error", table.written_name, problem)
