"""Every exception the tool raises on purpose, by the exit code it ends a command with
(docs/commands.md: Exit codes): 1 `ReplicatorError` (a table or a command failed), 2 `UsageError`
(bad usage or config, nothing touched), 75 `Busy` (someone else is at it: run again later),
128 + the signal's number `Interrupted` (SIGINT, SIGTERM, SIGHUP).

Kept free of imports: Spark's Python workers import it with the copy task.
"""

from __future__ import annotations

import signal


def one_line(exc: BaseException) -> str:
    """An error's first line, for a table's result or verdict (its class name when empty)."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


class ReplicatorError(Exception):
    """A failure with a message meant for the user; subclasses fix the exit code."""

    exit_code = 1


class UsageError(ReplicatorError):
    """Bad usage or configuration, found before anything was touched."""

    exit_code = 2


class ConfigError(UsageError):
    """tables-config.json (or a connection setting) is invalid; lists every problem found."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = problems
        super().__init__("\n".join(problems))


class Busy(ReplicatorError):
    """Another replicator is doing this right now: not a failure, try again later."""

    exit_code = 75


class LockHeld(Busy):
    """Another replicator process holds the project's run lock."""


class TableLocked(Busy):
    """Another replicator (another host, a copy of the project) is syncing this destination
    table right now."""


class StateError(ReplicatorError):
    """A sync-state file cannot be trusted (corrupt, truncated, future format)."""


class StateWriteError(ReplicatorError):
    """A sync-state file could not be written (a full disk, a read-only folder). The old
    file is left as it was, so the next run redoes what this one could not record."""


class TemplateError(ReplicatorError):
    """A model or macro does not render or does not parse; names the file and line."""


class TableProblem(ReplicatorError):
    """Something about one table (in a database or its model) that stops its sync."""


class DatabaseError(ReplicatorError):
    """A database could not be reached or answered with an error."""

    def __init__(
        self, message: str, sqlstate: str | None = None, detail: str | None = None
    ) -> None:
        super().__init__(message)
        self.sqlstate = sqlstate  # PostgreSQL's error code, for the callers that recover
        self.detail = detail  # PostgreSQL's DETAIL line, when it sent one


# SQLSTATE classes of errors that happen again on a retry with the same data: data
# exceptions (22: division by zero), integrity (23), syntax or access (42), unsupported
# (0A), cardinality (21), and PL/pgSQL's RAISE (P0). Connections, cancels and locks pass.
LASTING_CLASSES = frozenset(("21", "22", "23", "42", "0A", "P0"))


class TaskError(Exception):
    """A copy task's failure in one line that names the side (and, on the source, the
    model): `source: division by zero (reading models/shop/orders.sql)`. Raised in Spark's
    workers, so not a ReplicatorError: the driver turns it into one. `lasting`: another
    attempt would fail the same way (its SQLSTATE says so), so Spark need not retry it."""

    def __init__(self, message: str, sqlstate: str | None = None) -> None:
        super().__init__(message)
        self.sqlstate = sqlstate

    @property
    def lasting(self) -> bool:
        return (self.sqlstate or "")[:2] in LASTING_CLASSES


class Interrupted(KeyboardInterrupt):
    """The process received SIGINT, SIGTERM or SIGHUP. A KeyboardInterrupt, so psycopg
    cancels the query it interrupts, and `except Exception` never swallows it."""

    def __init__(self, signum: int) -> None:
        self.signum = signum
        self.reported = False  # set once the command has said so (sync's "run interrupted")
        super().__init__(self.describe())

    @property
    def exit_code(self) -> int:
        return 128 + self.signum

    @property
    def signal_name(self) -> str:
        return signal.Signals(self.signum).name

    def describe(self) -> str:
        return f"interrupted by {signal.Signals(self.signum).name}"
