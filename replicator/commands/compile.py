"""`replicator compile`: what each table's next sync would do and run, printed, nothing executed.

Per table: the plan (incremental or a full reload, and why), the schema changes found against
the last load (each with the ALTER that expresses it), and the statements of each action, as
the action itself builds them (sync/action_scripts.py): the full reload, the incremental
batch, a start without backfill, a re-sync with --since. Catalogs are read; nothing is
written anywhere. `--json` gives the same as one document, with every statement's side and
bound values under `script`.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from typing import Any

import click
import psycopg

from ..base.errors import ReplicatorError, TableProblem
from ..base.identifiers import display_ident
from ..base.redact import redact
from ..cdc.apply.apply_sql import apply_steps
from ..cdc.preflight import applied_where, capture_problem
from ..plan.drift import Planned, plan_now
from ..plan.read_ahead import read_ahead
from ..postgres.database import Step, connect, display, render
from ..postgres.types.key_equality import key_equality
from ..postgres.types.type_closure import staged_base
from ..project.config import TableConfig
from ..project.project import Project
from ..project.settings import DEST_URL
from ..project.state import TableState
from ..report.logs import json_output
from ..sync.action_scripts import ActionScripts, Inputs, Item, Tasks, action_scripts
from ..sync.context import KeyBounds
from ..sync.incremental.resync import resync_bounds


def compile_tables(
    project: Project,
    names: tuple[str, ...],
    as_json: bool = False,
    since: str | None = None,
    until: str | None = None,
) -> int:
    """Print each table's plan and statements; a table that cannot be built is reported,
    exit 1. With `since` (and `until`), the one selected table's re-sync script too."""
    tables = project.select(names)
    source_url = project.env.source()
    resync = resync_bounds(tables, names, False, since, until, source_url)
    failed = 0
    documents: list[dict[str, Any]] = []
    with (
        connect(source_url, "source") as conn,
        _destination(project) as (dest, dest_note),
    ):
        if dest_note and not as_json:
            click.echo(f"-- {dest_note}\n")
        ahead = read_ahead(conn, dest, tables)
        inputs = Inputs(conn, dest, (source_url, ""), project.settings, ahead)
        for table in tables:
            try:
                compiled = _compile_table(project, inputs, table, resync)
            except ReplicatorError as exc:
                failed += 1
                if as_json:
                    documents.append({"name": table.written_name, "error": redact(str(exc))})
                else:
                    click.echo(redact(f"-- {table.written_name}: error: {exc}\n"))
                continue
            if as_json:
                documents.append(compiled.as_json(dest_note))
            else:
                click.echo(compiled.text())
    if as_json:
        indent = None if json_output() else 2  # one line under --log-format json
        click.echo(json.dumps(documents, indent=indent, ensure_ascii=False, default=str))
    return 1 if failed else 0


@contextlib.contextmanager
def _destination(project: Project) -> Iterator[tuple[psycopg.Connection[Any] | None, str | None]]:
    """The destination, to look at its tables; compile still works without it."""
    url = project.optional_destination()
    if url is None:
        yield None, f"destination not inspected: {DEST_URL} is not set"
        return
    try:
        conn = connect(url, "destination")
    except ReplicatorError as exc:
        yield None, redact(f"destination not inspected: {exc}")
        return
    with conn:
        yield conn, None


class CompiledTable:
    """One table's plan, drift, and the statements of each action (`action_scripts`)."""

    def __init__(
        self,
        planned: Planned,
        scripts: ActionScripts,
        cursor: str,
        conn: psycopg.Connection[Any],
    ) -> None:
        self.built, self.observed, self.plan = planned.built, planned.observed, planned.plan
        self.source = planned.source
        self.scripts, self.cursor, self.conn = scripts, cursor, conn

    def _lines(self, items: list[Item] | None) -> list[str]:
        """The statements as they would run, values inlined; the copy tasks and anything on
        the source as comments (they are not destination statements a person can rerun)."""
        lines: list[str] = []
        for item in items or []:
            if isinstance(item, Tasks):
                total = len(item.steps)
                for number, steps in enumerate(item.steps, 1):
                    parts = sum(s.text.startswith("COPY") for s in steps) - 1
                    lines.append(
                        f"-- copy task {number} of {total}, a transaction on each side (its "
                        "marker row claimed first, filled last; every statement: --json)"
                        if parts == 1
                        else f"-- copy, its rows cut into {parts} staging tables as they come, "
                        "each merged as it lands (every statement: --json)"
                    )
                    lines += [
                        _comment(f"--   {s.side}: {display(self.conn, s)}")
                        for s in steps
                        if s.text.startswith(("COPY", "TRUNCATE"))
                    ]
            elif item.side == "source":
                lines.append(_comment(f"-- source: {display(self.conn, item)}"))
            else:
                lines.append(display(self.conn, item))
        return lines

    def changes_json(self) -> dict[str, list[dict[str, Any]]]:
        target = self.built.table.target
        return {
            "schema": [c.as_json(target) for c in self.observed.schema_changes],
            "destination": [c.as_json(target) for c in self.observed.destination_changes],
            "model": [self.observed.model_changed.as_json(target)]
            if self.observed.model_changed
            else [],
            "partitions": [self.observed.partitions_changed.as_json(target)]
            if self.observed.partitions_changed
            else [],
        }

    def _where_lines(self) -> list[str]:
        """Where a `cdc` table's `where` runs: the publication's row filter, or the apply."""
        shaping = self.built.shaping
        if shaping is None or shaping.where is None:
            return []
        if applied_where(self.conn, self.source, self.built) is not None:
            return [
                "-- where runs at the apply, over each change's new row (it reads columns",
                "--   outside the replica identity): the publication sends every row, and a",
                "--   change whose new row it does not keep deletes its key (the UPDATE of",
                "--   replicator_last below)",
                "",
            ]
        return ["-- where is the publication's row filter: the source sends only its rows", ""]

    def cdc_apply(self) -> list[Step] | None:
        """A `cdc` table's apply of a batch of changes (cdc/apply/apply_sql.py)."""
        built = self.built
        if built.table.mode != "cdc":
            return None
        columns = tuple(c.name for c in built.columns)
        repeat = built.table.primary_key is not None
        # a built-in type, printed unqualified (catalog.Column), is no domain: no query
        staged = {
            c.name: staged_base(self.conn, c.type_oid) for c in built.columns if "." in c.type
        }
        undomained = {name: base for name, base in staged.items() if base is not None}
        equals = key_equality(self.conn, built.table.source, built.primary_key)
        where = applied_where(self.conn, self.source, built)
        return apply_steps(
            built.table.target, columns, built.primary_key, repeat, undomained, equals, where
        )

    def as_json(self, dest_note: str | None) -> dict[str, Any]:
        built = self.built
        table = built.table
        incremental = built.incremental_extract
        scripts = self.scripts
        cdc_apply = self.cdc_apply()
        return {
            "name": table.written_name,
            "destination": str(table.target),
            "mode": table.mode,
            "model": built.model.origin,
            "next_action": self.plan.action,
            "reason": self.plan.reason,
            "fix": self.plan.fix,
            "destination_note": dest_note,
            "notes": scripts.notes,
            "changes": self.changes_json(),
            "cursor": self.cursor,
            "sql": {
                "create_destination": render(built.create_destination),
                "full_reload": self._lines(scripts.full_reload),
                "incremental": self._lines(scripts.incremental) or None,
                "start_without_backfill": self._lines(scripts.start) or None,
                "resync": self._lines(scripts.resync) or None,
                "cdc_apply": self._lines(list(cdc_apply)) if cdc_apply else None,
                "cdc_evolution": self._lines(scripts.cdc_evolution) or None,
                "extract_full": render(built.full_extract),
                "extract_incremental": render(incremental) if incremental is not None else None,
                "merge": built.merge,
            },
            # Every statement with its side and bound values, as the actions run them.
            "script": {
                name: _structured(items)
                for name, items in (
                    ("full_reload", scripts.full_reload),
                    ("incremental", scripts.incremental),
                    ("start_without_backfill", scripts.start),
                    ("resync", scripts.resync),
                    ("cdc_apply", cdc_apply),
                    ("cdc_evolution", scripts.cdc_evolution),
                )
                if items is not None
            },
        }

    def text(self) -> str:
        """The readable compile output of one table."""
        built, scripts = self.built, self.scripts
        table = built.table
        plan = self.plan
        lines = [
            f"-- {table.written_name} -> {table.target}",
            f"-- mode {table.mode}; {built.key.describe()}; replication key "
            f"{display_ident(table.replication_key) if table.replication_key else 'none'}",
            f"-- model: {built.model.origin}",
            f"-- next sync: {plan.action} ({plan.reason})",
        ]
        if plan.fix:
            lines.append(f"-- fix: {plan.fix}")
        lines += [f"-- note: {note}" for note in scripts.notes]
        evolves = plan.reason.startswith("schema evolved: ")
        for title, changes in (
            ("source schema changes since the last load", self.observed.schema_changes),
            ("destination table changes", self.observed.destination_changes),
        ):
            if not changes:
                continue
            if evolves and changes is self.observed.schema_changes:
                where = "the incremental script"
                if table.mode == "cdc":
                    where = "the cdc schema evolution"
                lines.append(f"-- {title} (taken in place: {where} runs them):")
                lines += [f"--   {change.describe()}" for change in changes]
                continue
            lines.append(f"-- {title} (a sync reloads the table instead of running these):")
            for change in changes:
                expression = change.expression(table.target)
                lines.append(f"--   {change.describe()}")
                if expression is not None:
                    lines.append(f"--     {expression.sql(dialect='postgres')};")
        lines += ["", "-- destination table", render(built.create_destination) + ";"]
        if scripts.start is not None:
            lines += ["", "-- start without backfill (initial_load skip): what the next sync runs"]
            lines += _terminated(self._lines(scripts.start))
        lines += ["", "-- full reload: side table, load, key, swap"]
        lines += _terminated(self._lines(scripts.full_reload))
        lines += ["", "-- extract (full load)", render(built.full_extract) + ";"]
        if built.incremental_extract is not None:
            lines += [
                "",
                f"-- extract (incremental); cursor: {self.cursor}",
                render(built.incremental_extract) + ";",
            ]
        if scripts.incremental is not None:
            what = "schema evolution, then " if evolves else ""
            lines += ["", f"-- incremental: {what}staging table, load, merge"]
            lines += _terminated(self._lines(scripts.incremental))
        if scripts.resync is not None:
            lines += ["", "-- re-sync of --since .. --until: staging table, load, merge"]
            lines += _terminated(self._lines(scripts.resync))
        if built.merge is not None:
            lines += ["", "-- staging table", *_terminated(self._lines(scripts.staging))]
            lines += ["", "-- merge", built.merge + ";"]
        if table.mode == "cdc":
            lines += [
                "",
                "-- cdc: a full reload loads from the snapshot of a temporary logical slot and",
                "--   records its log position in _replicator.cdc_applied in the swap's",
                "--   transaction. Each later run streams the project's slot (START_REPLICATION",
                "--   ... LOGICAL, pgoutput) up to the WAL flushed when it began, stages the",
                "--   changes with COPY in a temporary table, applies them in one transaction",
                "--   (a TRUNCATE truncates; per key the last change wins: DELETE, INSERT ...",
                "--   ON CONFLICT DO UPDATE where rows differ) that also records the position,",
                "--   then confirms that position to the slot.",
                "",
                *self._where_lines(),
                "-- cdc apply of a batch (staged in replicator_stage_N)",
                *_terminated(self._lines(list(self.cdc_apply() or []))),
            ]
            if scripts.cdc_evolution is not None:
                lines += [
                    "",
                    "-- cdc schema evolution: once the log is applied up to the change (its first",
                    "--   transaction of the new shape, or the drain's end when none follows),",
                    "--   then the log is applied again from there, and the NOT NULLs are set",
                    *_terminated(self._lines(scripts.cdc_evolution)),
                ]
        if table.deletes != "ignore":
            when = f"every {table.deletes_interval} s" if table.deletes_interval else "every sync"
            verb = "deleted" if table.deletes == "delete" else "marked (_replicator_deleted_at)"
            lines += [
                "",
                f"-- delete check (deletes: {table.deletes}, {when}, or `sync --deletes`): after",
                "--   the merge, the model's keys and the destination's are hashed per key range",
                "--   in one snapshot each; rows whose key the source no longer has are",
                f"--   {verb} in one transaction (more than half of the table: only with --force)",
            ]
        return "\n".join(lines) + "\n"


def _comment(text: str) -> str:
    """A statement shown as a comment, its later lines commented too."""
    return text.replace("\n", "\n--     ")


def _terminated(lines: list[str]) -> list[str]:
    return [line if line.startswith("--") else line + ";" for line in lines]


def _structured(items: list[Item]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for item in items:
        if isinstance(item, Tasks):
            for number, steps in enumerate(item.steps, 1):
                out += [{"task": number, **_step_json(step)} for step in steps]
        else:
            out.append(_step_json(item))
    return out


def _step_json(step: Step) -> dict[str, Any]:
    return {"side": step.side, "sql": step.text, "params": step.params}


def _compile_table(
    project: Project,
    inputs: Inputs,
    table: TableConfig,
    resync: KeyBounds | None,
) -> CompiledTable:
    state = project.planning_state(table)
    planned = plan_now(
        inputs.source, inputs.dest, table, project.templates, state, ahead=inputs.ahead
    )
    if table.mode == "cdc":  # what the sync fails such a table for, before any plan
        problem = capture_problem(
            inputs.source,
            planned.source,
            planned.built,
            project.cdc_tables,
        )
        if problem is not None:
            raise TableProblem(problem)
    scripts = action_scripts(
        inputs,
        planned.built,
        planned.source,
        state,
        planned.plan,
        planned.observed.destination is not None,
        resync,
        evolving=planned.observed,
    )
    return CompiledTable(planned, scripts, _cursor_note(state), inputs.source)


def _cursor_note(state: TableState | None) -> str:
    if state is None or state.last_synced_at is None:
        return "none (no state: the next sync is a full load)"
    if state.cursor is None:
        return "none (the source was empty at the last sync)"
    return f"{state.cursor.value} ({state.cursor.type})"
