"""Exceptions that carry the CLI exit code they end a command with (README: Exit codes)."""

from __future__ import annotations


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


class LockHeld(ReplicatorError):
    """Another replicator process holds the project's run lock."""

    exit_code = 75


class StateError(ReplicatorError):
    """A sync-state file cannot be trusted (corrupt, truncated, future format)."""


class DatabaseError(ReplicatorError):
    """A database could not be reached or answered with an error."""

    def __init__(
        self, message: str, sqlstate: str | None = None, detail: str | None = None
    ) -> None:
        super().__init__(message)
        self.sqlstate = sqlstate  # PostgreSQL's error code, for the callers that recover
        self.detail = detail  # PostgreSQL's DETAIL line, when it sent one
