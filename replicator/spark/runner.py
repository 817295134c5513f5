"""Runs the COPY tasks of a load on Spark, starting Spark in the background.

Spark is either a JVM this process starts (`spark.master`: local[*] or a cluster's master)
or a Spark Connect server it connects to (`spark.remote`, or the project's warm server from
`replicator spark start`). Either way a copy is one Spark job (task_job.py): an RDD's on a
JVM here, a DataFrame's on a Connect server.
Starting takes seconds (a JVM) or about a second (a Connect client): a run starts as soon as
it knows a table needs data moved, and keeps inspecting catalogs and writing DDL meanwhile.
A run that moves nothing never starts a JVM, nor loads the modules that start one (each
method that starts or uses Spark imports them). Which copies go to Spark at all is
engine_choice.py's call: `spark.min_rows` when set, else what this host measured.

A Connect server that stops answering mid-job fails that table (the client retries for
about 14 s first). Then the rest of the run does without it: after the warm server, as a
run without it would (spark.master, chosen as engine_choice.py says); after a configured
spark.remote, whose loss no Spark here replaces, each table that needs Spark fails at once.
"""

from __future__ import annotations

import logging
import re
import sys
import threading
import time
import uuid
import weakref
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, TypeVar

from .. import __version__
from ..base.errors import ReplicatorError
from ..base.interrupts import on_interrupt, raise_if_requested, requested
from ..base.redact import redact
from ..project.settings import Settings
from ..project.spark_remote import Remote
from ..project.spark_server_state import ServerState
from ..transfer.copy_stream import CopyResult, CopyTask, TaskError, run_copy_task
from .engine_choice import IN_PROCESS, MEASURED_ROWS, EngineChoice
from .jvm_stop import jvm_pid

if TYPE_CHECKING:
    from .jvm_archive import ArchivePlan

_DRIVER_OPTIONS = "spark.driver.extraJavaOptions"
log = logging.getLogger(__name__)
# The sessions whose first job ran already: the Python workers are up.
_WARMED: weakref.WeakSet[Any] = weakref.WeakSet()
T = TypeVar("T")
R = TypeVar("R")


class SparkRunner:
    """The run's one Spark session, created lazily."""

    def __init__(
        self,
        master: str | None,
        conf: Mapping[str, str],
        *,
        quiet: bool = True,
        min_rows: int | None = 0,
        ship_environment: bool = True,
        remote: str | None = None,
        warm_server: ServerState | None = None,
    ):
        self.master, self.conf, self.quiet = master, dict(conf), quiet
        self.min_rows = min_rows  # None: chosen from this host's measurements
        self.ship_environment = ship_environment
        self.remote = Remote.parse(remote) if remote else None
        self.warm_server = warm_server
        self.choice = self._choice()
        self._thread: threading.Thread | None = None
        self._session: Any = None
        self._parallelism = 1
        self._sized = threading.Event()  # _parallelism is known
        self._error: BaseException | None = None
        self._archive: ArchivePlan | None = None
        # Release the Connect session at the end: all but the warm server's shared one.
        self._release = warm_server is None
        self._gone = False  # the warm server did not answer: start again without it
        self._lost: str | None = None  # spark.remote stopped answering: the tables' error
        # When the session's start began and ended: its whole time goes to the figures of
        # the first copy that waits for it (`_start_cost`).
        self._start_began: float | None = None
        self._start_ended: float | None = None

    @classmethod
    def for_run(cls, settings: Settings, verbose: int) -> SparkRunner:
        """A command's runner, from the project's resolved settings (Spark's own chatter
        only under -v)."""
        return cls(
            settings.spark_master,
            settings.spark_conf,
            quiet=verbose == 0,
            min_rows=settings.min_rows,
            ship_environment=settings.ship_environment,
            remote=settings.spark_remote,
            warm_server=settings.warm_server,
        )

    @property
    def where(self) -> str:
        """Where the tasks run, for log lines and errors."""
        if self.remote is None:
            return f"Spark ({self.master or 'local[*]'})"
        kind = "the warm Spark server" if self.warm_server else "the Spark Connect server"
        return f"{kind} at {self.remote}"

    def _choice(self) -> EngineChoice:
        """The copy engine's choice for where the tasks run now."""
        remote = str(self.remote) if self.remote else None
        warm = self.warm_server.parallelism if self.warm_server is not None else None
        return EngineChoice.of(self.master, remote, warm, self.min_rows)

    @property
    def started(self) -> bool:
        return self._thread is not None and not self._gone

    def warm_up(self) -> None:
        """Start the session in a background thread, if not started yet."""
        if self._thread is None:
            self._start_began, self._start_ended = time.monotonic(), None
            self._thread = threading.Thread(target=self._start, name="spark-start", daemon=True)
            self._thread.start()

    def _start(self) -> None:
        from .task_job import default_parallelism, run_job

        try:
            if self.warm_server is not None:  # its session's Python workers are up already
                self._session = self._attach(self.warm_server)
                self._gone = self._session is None
                if self._session is not None:
                    self._parallelism = self.warm_server.parallelism
                return
            session, warm = self._connect() if self.remote else self._start_jvm()
            if self.remote is not None:
                self._parallelism = default_parallelism(session)
                self._sized.set()
            if not warm:
                # The first job forks Spark's Python workers (about half a second) and, on
                # a Connect server, warms Spark SQL's planning (a second): do it now.
                run_job(session, abs, list(range(self._parallelism)), _alias())
                if self.remote is None:
                    _WARMED.add(session)
            self._session = session
            self._start_ended = time.monotonic()
        except BaseException as exc:  # surfaced to the table that needs Spark
            self._error = exc
        finally:
            self._sized.set()

    def _attach(self, server: ServerState) -> Any:
        """The warm server's own session, else a new one on it if it forgot that one. When
        it does not answer (stopped or dead since the settings were read), None: the run
        goes on as it would have without the server. Nothing is shipped: the server runs
        this machine's replicator (the same code, or no run uses it)."""
        from .connect_session import attach, connect

        assert self.remote is not None
        try:
            session = attach(self.remote, server.session_id)
            if session is None:
                self._release = True
                session = connect(self.remote)
            return session
        except ReplicatorError as exc:
            log.warning("%s; this run %s", exc, self._without_server())
            return None

    def _connect(self) -> tuple[Any, bool]:
        from .connect_session import connect

        assert self.remote is not None
        shipped = None
        if self.ship_environment:
            from .executor_env import executor_archive

            shipped = executor_archive()
        return connect(self.remote, shipped), False

    def _start_jvm(self) -> tuple[Any, bool]:
        """This process's SparkContext, and whether it ran a job before (a process that
        runs several commands, as the tests do, keeps its JVM and Python workers)."""
        from pyspark import SparkContext

        from .jvm_archive import plan_archive
        from .session import jdbc_jar, shipped_archive, start_spark_context

        if SparkContext._gateway is None:  # a new driver JVM: use or build the archive
            jars = self.conf.get("spark.jars", str(jdbc_jar() or ""))
            self._archive = plan_archive(jars, self.conf.get(_DRIVER_OPTIONS, ""))
        options = self._archive.options if self._archive else ""
        context = start_spark_context(
            self.master,
            self.conf,
            quiet=self.quiet,
            driver_options=options,
            executor_archive=shipped_archive(self.master, self.ship_environment),
        )
        # Known now: the run plans its partitions while the session gets ready.
        self._parallelism = int(context.defaultParallelism)
        self._sized.set()
        return context, context in _WARMED

    def _without_server(self) -> str:
        """Go on as a run without the warm server would; says how. Spark here starts
        when a table needs it (`_start_over`)."""
        self.remote = self.warm_server = None
        self.choice = self._choice()
        self._release = True
        if self.min_rows == 0:
            return f"runs without it, on {self.where}"
        return (
            f"runs without it, on {self.where} {self.choice.describe()}, "
            "other copies in this process"
        )

    def _start_over(self) -> bool:
        """After the warm server was found gone: not started, as in a run without it."""
        if not self._gone:
            return False
        assert self._thread is not None
        self._thread.join()
        self._gone = False
        self._thread, self._sized = None, threading.Event()
        return True

    def session(self) -> Any:
        self.warm_up()
        assert self._thread is not None
        self._thread.join()
        if self._start_over():
            return self.session()
        if self._error is not None:
            if isinstance(self._error, ReplicatorError):
                raise ReplicatorError(f"Spark did not start: {self._error}")
            raise ReplicatorError(
                f"Spark did not start ({self.where}): {spark_error_message(self._error)}"
            )
        return self._session

    def parallelism(self) -> int:
        """Spark's task slots; known before the session is ready on a JVM here."""
        self.warm_up()
        self._sized.wait()
        if self._start_over():
            return self.parallelism()
        if self._error is not None:
            self.session()  # raises it
        return self._parallelism

    def needed_for(self, estimated_rows: int) -> bool:
        """Whether a copy of about this many rows goes to Spark (else: this process)."""
        return self.choice.spark_for(estimated_rows)

    def may_choose(self) -> bool:
        """Whether a copy of some size would go to Spark (else: never, whatever the size)."""
        return self.choice.spark_for(1 << 62)

    def run_copy_tasks(
        self, tasks: list[CopyTask], *, in_process: bool = False
    ) -> list[CopyResult]:
        """Run one Spark task per partition; return their row and byte counts.

        `in_process`: the copy runs the same tasks here, one after another. Either way the
        copy's rate goes to this host's figures (engine_choice.py)."""
        began = time.monotonic()
        if in_process:
            try:
                results = [run_copy_task(task) for task in tasks]
            except TaskError as exc:
                raise_if_requested()  # a query cancelled by the interruption
                raise ReplicatorError(str(exc)) from None
            self.choice.record(IN_PROCESS, _rows(results), time.monotonic() - began)
            return results
        key = self.choice.where
        self.session()  # the wait for Spark is part of what the copy cost
        ready = time.monotonic()
        results = self.map_tasks(run_copy_task, tasks, "replicator copy")
        rows = _rows(results)
        waited = self._start_cost(ready - began) if rows >= MEASURED_ROWS else ready - began
        self.choice.record(key, rows, time.monotonic() - ready, waited)
        return results

    def _start_cost(self, waited: float) -> float:
        """What a copy that `waited` for Spark paid for its start: all of the start for the
        run's first measured copy, though the run did its other work meanwhile (on a small
        host the JVM's start slows that work about as much as the copy would have waited: a
        forced 5M-row load's copy waited 0.7 s of a start of more than 3); its own wait for
        the later ones."""
        if self._start_began is None or self._start_ended is None:
            return waited
        cost = self._start_ended - self._start_began
        self._start_began = None  # charged once
        return cost

    def map_tasks(self, function: Callable[[T], R], tasks: list[T], description: str) -> list[R]:
        """Run `function` over the tasks as one Spark job, one partition per task; a SIGTERM
        or SIGINT cancels the job."""
        from .connect_session import unavailable
        from .task_job import run_job

        if self._lost is not None:  # spark.remote stopped answering earlier in this run
            raise ReplicatorError(self._lost)
        session = self.session()
        log.debug("%s: %d task(s) on %s", description, len(tasks), self.where)
        tag = f"replicator-{uuid.uuid4().hex}"
        stop_cancelling = self._cancellable(session, tag, description)
        try:
            return run_job(session, function, tasks, _alias())
        except TaskError as exc:  # a task's lasting failure, returned rather than retried
            raise ReplicatorError(redact(f"Spark task failed: {exc}")) from None
        except Exception as exc:
            raise_if_requested()  # the job failed because the run was interrupted
            if self.remote is not None and unavailable(exc):
                raise ReplicatorError(self._server_lost(session)) from None
            message = spark_error_message(exc)
            raise ReplicatorError(message + self._executor_hint(message)) from None
        finally:
            stop_cancelling()

    def _cancellable(self, session: Any, tag: str, description: str) -> Callable[[], None]:
        """Tag this thread's next job so that an interruption cancels it (and interrupts
        its tasks); returns the function that removes the tag and the hook."""
        if self.remote is not None:
            session.addTag(tag)
            remove = on_interrupt(lambda: session.interruptTag(tag))

            def untag() -> None:
                remove()
                session.removeTag(tag)

            return untag
        session.setJobGroup(tag, description, interruptOnCancel=True)  # a SparkContext here
        return on_interrupt(lambda: session.cancelJobGroup(tag))

    def _server_lost(self, session: Any) -> str:
        """The table's error once the Connect server stopped answering; what the rest of
        the run does instead (see the module's docstring)."""
        from .connect_session import abandon

        abandon(session)
        lost = f"{self.where} stopped answering"
        error = f"{lost}: the table's work was rolled back"
        if self.warm_server is None:
            self._lost = f"{error}; the next run copies it again once the server answers"
            return self._lost
        self._session, self._thread, self._sized = None, None, threading.Event()
        log.warning("%s: the rest of this run %s", lost, self._without_server())
        return f"{error}; the next run copies it again"

    def _executor_hint(self, message: str) -> str:
        """What to do when a cluster's executors could not import our code."""
        from .session import is_local

        if "No module named" not in message or is_local(self.master):
            return ""
        if not self.ship_environment:
            return (
                f"; the executors' Python lacks replicator {__version__} or a dependency: "
                "install them there, or set spark.ship_environment to true to ship them "
                "with each run"
            )
        from .executor_env import platform_tag

        return (
            f"; the shipped environment is built for {platform_tag()}: the executors' "
            f"Python must be {sys.version_info.major}.{sys.version_info.minor} on that "
            "platform (spark.pyspark.python names it)"
        )

    def finish(self) -> None:
        """End of the run. A Connect session is released (the server keeps running). A JVM
        here stays for the process's next run (tests run many in one process) and the
        console script stops it as it exits (spark/jvm_stop.py: no JVM of the run
        outlives the command). The run that listed its JVM's classes hands the list to the
        class archive's builder, which goes on detached (jvm_archive.py)."""
        if self._thread is not None and self._thread.is_alive() and self._release:
            self._thread.join(timeout=10)  # a session being opened: release it too
        session, self._session = self._session, None
        archive, self._archive = self._archive, None
        if archive is not None and archive.pending is not None:
            from .jvm_archive import build_archive_later, discard_archive

            if session is None or requested() is not None:
                discard_archive(archive)  # a run that did not get through: a later one
            else:
                build_archive_later(archive, jvm_pid())
        if session is None:
            return
        if self.remote is not None:
            from .connect_session import close

            close(session, release=self._release)  # the warm server's stays


def _alias() -> str:
    """Where the shipped environment unpacks (executor_env.py imports packaging and
    tarfile: only a run that starts Spark pays for them)."""
    from .executor_env import ALIAS

    return ALIAS


def _rows(results: list[CopyResult]) -> int:
    return sum(result.rows for result in results)


# "... most recent failure: Lost task 1.0 in stage 0.0 (TID 1) (host executor driver):
# org.apache.spark.SparkException: Python worker exited unexpectedly (crashed). ..."
_EXCEPTION_CLASS = re.compile(r"^[A-Za-z_][\w.]*: ")
_LOST_TASK = re.compile(r"most recent failure: Lost task [^\n]*?\): (?:[\w.$]+: )?([^\n]+)")


def spark_error_message(exc: BaseException) -> str:
    """The Python exception line from inside a failed Spark task, else the first line."""
    text = str(exc)
    marker = text.rfind("Traceback (most recent call last):")
    if marker >= 0:
        for line in text[marker:].splitlines()[1:]:
            if line and not line[0].isspace():
                # `replicator.copy_stream.TaskError: source: ...`: the message, not the class
                message = _EXCEPTION_CLASS.sub("", line.strip(), count=1)
                return redact(f"Spark task failed: {message}")
    lost = _LOST_TASK.search(text)
    if lost:  # the task died without a Python exception (its worker was killed, say)
        return redact(f"Spark task failed: {lost.group(1).split('. ')[0].strip()}")
    first = next((line for line in text.splitlines() if line.strip()), type(exc).__name__)
    return redact(f"Spark job failed: {first.strip()}")
