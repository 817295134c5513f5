"""The OpenLineage events of one sync run, and the thread that sends them (report/lineage.py
decides whether a run has any, and imports this module only then).

A table's job is `replicator.<project folder>.<schema>.<table>` in the namespace
`OPENLINEAGE_NAMESPACE` (as the client's dbt and Airflow integrations read it), else
`replicator`; its parent is the sync run. The input dataset is the source table, the output
its copy, each named as the spec names a PostgreSQL table (`postgres://host:port`,
`db.schema.table`): nothing else of a connection string (its user, its password) is read.
Both events carry both tables' columns (the schema facet) when the table's load began; a
table with nothing new (the no-op screen) or one that failed before its load sends its START
with its COMPLETE or FAIL, without columns. COMPLETE has the rows and bytes the run moved
(outputStatistics), FAIL the table's error as the log says it (errorMessage, secrets masked).

Sending never holds the run back: the client is imported and built, the events are made and
posted, on a thread of their own (the import takes 0.2-0.3 s). The run waits for what is
still unsent at most WAIT_SECONDS at its end; an HTTP endpoint gets TIMEOUT_SECONDS an
attempt and one retry. An endpoint that fails once (down, silent, a refusal) is warned of
once and sent nothing more in that run; the exit code never changes.
"""

from __future__ import annotations

import getpass
import logging
import os
import queue
import threading
import uuid
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import urlsplit

from psycopg.conninfo import conninfo_to_dict

from .. import __version__
from ..base.identifiers import TableName
from ..base.redact import redact, register_secret
from ..plan.drift import Planned
from ..postgres.catalog import Column
from ..project.config import TableConfig
from ..project.project import Project
from .results import TableResult, utc_now

log = logging.getLogger(__name__)

WAIT_SECONDS = 3.0
TIMEOUT_SECONDS = 2.0
DEFAULT_NAMESPACE = "replicator"
PRODUCER = f"urn:replicator:{__version__}"
_PREFIX = "OPENLINEAGE"  # the variables the client reads (lineage.PREFIX)


@dataclass(frozen=True)
class Dataset:
    """A table as the spec names it; `columns` (name, type) when the run described it."""

    namespace: str
    name: str
    columns: tuple[tuple[str, str], ...] | None = None


@dataclass(frozen=True)
class Note:
    """One event to make: what the run knows, in plain values (the client is not imported
    on the run's thread)."""

    state: str  # START, COMPLETE, FAIL or ABORT
    time: str
    table: TableName
    run_id: str
    source: Dataset
    copy: Dataset
    rows: int | None = None
    size: int | None = None
    error: str | None = None
    history: Dataset | None = None  # the copy's history table (tables[].history), an output
    versions: int | None = None  # the versions the run added there


@dataclass(frozen=True)
class Endpoint:
    """A database as a dataset's namespace and its name's first part."""

    namespace: str
    database: str

    @classmethod
    def of(cls, conninfo: str) -> Endpoint:
        """`postgres://host:port` and the database of a libpq connection string, libpq's
        defaults (PGHOST, PGPORT, PGDATABASE) filling what it leaves out; the first of
        several hosts; `localhost` for a Unix socket."""
        given = conninfo_to_dict(conninfo)
        host = str(given.get("host") or given.get("hostaddr") or os.environ.get("PGHOST") or "")
        host = host.split(",")[0]
        port = str(given.get("port") or os.environ.get("PGPORT") or "5432").split(",")[0]
        user = given.get("user") or os.environ.get("PGUSER") or getpass.getuser()
        database = given.get("dbname") or os.environ.get("PGDATABASE") or user
        host = "localhost" if not host or host.startswith("/") else host
        return cls(f"postgres://{host}:{port or '5432'}", str(database))

    def dataset(self, table: TableName, columns: tuple[Column, ...] | None = None) -> Dataset:
        described = None if columns is None else tuple((c.name, c.type) for c in columns)
        return self.named(table, described)

    def named(
        self, table: TableName, described: tuple[tuple[str, str], ...] | None = None
    ) -> Dataset:
        """The table, with its columns as (name, type) when known."""
        return Dataset(self.namespace, f"{self.database}.{table.schema}.{table.name}", described)


@dataclass(frozen=True)
class Jobs:
    """How the run's jobs are named: the namespace, the project, the sync's run."""

    namespace: str
    project: str
    sync_run_id: str

    def name(self, table: TableName | None = None) -> str:
        sync = f"replicator.{self.project}"
        return sync if table is None else f"{sync}.{table.schema}.{table.name}"


@dataclass(frozen=True)
class _Opened:
    """A table's run, from its START: the id its other event shares, its datasets."""

    table: TableName
    run_id: str
    source: Dataset
    copy: Dataset
    history: Dataset | None = None


# The columns a history table adds to the copy's (postgres/history_tables.py), with types.
HISTORY_COLUMNS = (
    ("_valid_from", "timestamp with time zone"),
    ("_valid_to", "timestamp with time zone"),
    ("_is_current", "boolean"),
    ("_op", "text"),
)


class RunEvents:
    """A sync run's events, from what the run loop tells (report/lineage.py)."""

    def __init__(
        self,
        sender: Sender,
        tables: Mapping[str, TableConfig],
        source: Endpoint,
        copy: Endpoint,
    ) -> None:
        self._sender = sender
        self._tables = tables
        self._source, self._copy = source, copy
        self._open: dict[str, _Opened] = {}  # begun, not finished; by written name
        self._told: dict[int, TableResult] = {}  # finished, by id (kept: ids stay theirs)

    @classmethod
    def for_run(cls, project: Project, run_id: str, settings: Mapping[str, str]) -> RunEvents:
        """`settings`: the OPENLINEAGE_* variables the client is to read."""
        register_secret(settings.get("OPENLINEAGE_API_KEY"))
        namespace = settings.get("OPENLINEAGE_NAMESPACE") or DEFAULT_NAMESPACE
        jobs = Jobs(namespace, project.root.name, str(uuid.UUID(run_id)))
        connections = project.connections()
        return cls(
            Sender(jobs, settings),
            {t.written_name: t for t in project.config.tables},
            Endpoint.of(connections.source),
            Endpoint.of(connections.destination),
        )

    def started(self, planned: Planned) -> None:
        """The table's load begins: its START, with the source's and the copy's columns."""
        table = planned.built.table
        if table.written_name in self._open:  # a cdc table begun by its drain, reloaded
            return
        history = None
        if table.history_table is not None:
            columns = [(c.name, c.type) for c in planned.built.columns]
            history = self._copy.named(table.history_table, (*columns, *HISTORY_COLUMNS))
        opened = _Opened(
            table.name,
            str(uuid.uuid4()),
            self._source.dataset(table.name, planned.source.columns),
            self._copy.dataset(table.target, planned.built.destination_columns),
            history,
        )
        self._open[table.written_name] = opened
        self._tell("START", utc_now(), opened)

    def finished(self, result: TableResult) -> None:
        """The table's COMPLETE or FAIL (its START first, when its load never began: a table
        with nothing new, one that failed before)."""
        if id(result) in self._told:
            return
        self._told[id(result)] = result
        table = self._tables.get(result.name)
        if table is None or not isinstance(table.destination, TableName):
            return  # a pattern that matched nothing: no table to name
        opened = self._open.pop(result.name, None)
        if opened is None:
            opened = _Opened(
                table.name,
                str(uuid.uuid4()),
                self._source.dataset(table.name),
                self._copy.dataset(table.target),
                self._copy.named(table.history_table) if table.history_table else None,
            )
            began = datetime.now(UTC) - timedelta(seconds=result.seconds)
            self._tell("START", _timestamp(began), opened)
        if result.status == "success":
            self._tell(
                "COMPLETE",
                utc_now(),
                opened,
                result.rows,
                result.bytes,
                versions=result.versions_added,
            )
        else:
            self._tell("FAIL", utc_now(), opened, error=result.error)

    def close(self, results: list[TableResult]) -> None:
        """The end of the run: the results not told yet (a run that lost a database, an
        interrupted one), an ABORT for a table begun and never finished, then at most
        WAIT_SECONDS for the events still unsent."""
        for result in results:
            self.finished(result)
        for opened in self._open.values():
            self._tell("ABORT", utc_now(), opened)
        self._open.clear()
        self._sender.close(WAIT_SECONDS)

    def _tell(
        self,
        state: str,
        time: str,
        opened: _Opened,
        rows: int | None = None,
        size: int | None = None,
        error: str | None = None,
        versions: int | None = None,
    ) -> None:
        note = Note(state, time, opened.table, opened.run_id, opened.source, opened.copy)
        note = replace(note, history=opened.history, versions=versions)
        self._sender.put(replace(note, rows=rows, size=size, error=error))


def _timestamp(moment: datetime) -> str:
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


class Sender:
    """The thread that imports the client, makes the events and emits them, in order."""

    def __init__(self, jobs: Jobs, settings: Mapping[str, str]) -> None:
        self.jobs = jobs
        self._settings = dict(settings)
        self._notes: queue.SimpleQueue[Note | None] = queue.SimpleQueue()
        self.queued = self.done = 0  # events put, events sent or dropped
        self._thread = threading.Thread(target=self._run, name="openlineage", daemon=True)
        self._thread.start()  # the client's import overlaps the run's first reads

    def put(self, note: Note) -> None:
        self.queued += 1
        self._notes.put(note)

    def close(self, seconds: float) -> None:
        """Wait at most `seconds` for the events still unsent; a run that sent none (its
        lock was held) does not wait for the import either."""
        self._notes.put(None)
        if not self.queued:
            return
        self._thread.join(seconds)
        if self._thread.is_alive():
            log.warning(
                "OpenLineage: %d of %d event(s) not sent within %g s of the run's end: the "
                "endpoint is slow or does not answer; the run goes on without them",
                self.queued - self.done,
                self.queued,
                seconds,
            )

    def _run(self) -> None:
        client = self._client()
        while (note := self._notes.get()) is not None:
            if client is not None:
                client = self._emit(client, note)
            self.done += 1
        if client is not None:
            client.close(TIMEOUT_SECONDS)

    def _emit(self, client: Any, note: Note) -> Any:
        """The client, or None once it failed: the rest of the run's events are dropped."""
        try:
            client.emit(run_event(note, self.jobs))
        except Exception as exc:
            log.warning(
                "OpenLineage: events to %s not sent (%s); this run sends no more",
                _where(client.transport),
                redact(_describe(exc)),
            )
            return None
        return client

    def _client(self) -> Any:
        """The client as its configuration makes it, with a short HTTP timeout; None (said)
        when the configuration is unusable or names no transport."""
        try:
            from openlineage.client import OpenLineageClient  # here: only when configured
            from openlineage.client.event_v2 import set_producer

            set_producer(PRODUCER)  # every event's and facet's `producer`
            with _environment(self._settings):
                client = OpenLineageClient()
        except Exception as exc:
            log.warning("OpenLineage: its configuration cannot be used: %s", redact(str(exc)))
            return None
        transport = client.transport
        if transport.kind == "console" and (client.config.transport or {}).get("type") is None:
            log.warning(
                "OpenLineage: %s names no transport type (say `transport: {type: http, url: "
                "...}`): no events are sent",
                self._settings.get("OPENLINEAGE_CONFIG", "openlineage.yml"),
            )
            return None
        if transport.kind == "http":
            transport.timeout = min(transport.timeout, TIMEOUT_SECONDS)
            transport.config.retry = {**transport.config.retry, "total": 1, "read": 0}
        return client


@contextmanager
def _environment(settings: Mapping[str, str]) -> Iterator[None]:
    """The process environment with the project's OPENLINEAGE_* settings while the client
    reads its configuration, which it takes from `os.environ` only; afterwards as it was
    (the client also writes its own aliases of OPENLINEAGE_URL there)."""
    before = {k: v for k, v in os.environ.items() if k.startswith(_PREFIX)}
    os.environ.update({k: v for k, v in settings.items() if k not in before})
    try:
        yield
    finally:
        for key in [k for k in os.environ if k.startswith(_PREFIX) and k not in before]:
            del os.environ[key]
        os.environ.update(before)


def _where(transport: Any) -> str:
    """The endpoint's scheme, host and port: its path and query may hold a key."""
    url = getattr(transport, "url", None)
    if not isinstance(url, str):
        return f"the {transport.kind} transport"
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.hostname}" + (f":{parts.port}" if parts.port else "")


def _describe(exc: BaseException) -> str:
    text = str(exc).splitlines()[0] if str(exc) else ""
    return f"{type(exc).__name__}: {text}"[:300] if text else type(exc).__name__


def run_event(note: Note, jobs: Jobs) -> Any:
    """The note as the client's RunEvent (imported here: the sender's thread)."""
    from openlineage.client.event_v2 import (
        InputDataset,
        Job,
        OutputDataset,
        Run,
        RunEvent,
        RunState,
    )
    from openlineage.client.facet_v2 import error_message_run, parent_run

    sync = jobs.name()
    parent = parent_run.ParentRunFacet(
        run=parent_run.Run(runId=jobs.sync_run_id),
        job=parent_run.Job(namespace=jobs.namespace, name=sync),
        root=parent_run.Root(
            run=parent_run.RootRun(runId=jobs.sync_run_id),
            job=parent_run.RootJob(namespace=jobs.namespace, name=sync),
        ),
    )
    facets: dict[str, Any] = {"parent": parent}
    if note.error is not None:
        facets["errorMessage"] = error_message_run.ErrorMessageRunFacet(
            message=note.error, programmingLanguage="python"
        )
    source, copy = note.source, note.copy
    return RunEvent(
        eventType=RunState[note.state],
        eventTime=note.time,
        run=Run(runId=note.run_id, facets=facets),
        job=Job(namespace=jobs.namespace, name=jobs.name(note.table)),
        inputs=[InputDataset(source.namespace, source.name, facets=_schema(source))],
        outputs=[
            OutputDataset(
                copy.namespace,
                copy.name,
                facets=_schema(copy),
                outputFacets=_statistics(note.rows, note.size),
            ),
            *(
                [
                    OutputDataset(
                        note.history.namespace,
                        note.history.name,
                        facets=_schema(note.history),
                        outputFacets=_statistics(note.versions),
                    )
                ]
                if note.history is not None
                else []
            ),
        ],
    )


def _schema(dataset: Dataset) -> dict[str, Any]:
    from openlineage.client.facet_v2 import schema_dataset

    if dataset.columns is None:
        return {}
    fields = [
        schema_dataset.SchemaDatasetFacetFields(name=name, type=kind, ordinal_position=number)
        for number, (name, kind) in enumerate(dataset.columns, 1)
    ]
    return {"schema": schema_dataset.SchemaDatasetFacet(fields=fields)}


def _statistics(rows: int | None, size: int | None = None) -> dict[str, Any]:
    from openlineage.client.facet_v2 import output_statistics_output_dataset as statistics

    if rows is None:
        return {}
    facet = statistics.OutputStatisticsOutputDatasetFacet(rowCount=rows, size=size)
    return {"outputStatistics": facet}
