"""A run's tables when the config has table patterns: matched against the source's catalog
now (plan/selection.py). A source out of reach matches them against the tables sync-state
knows instead, when those give every pattern a table and hold the tables named: the run
goes on and each table fails with the connection's error, recorded as its last run
(`status`, the history, the webhook), as in a project without patterns. Otherwise (a first
run, a table named that sync-state does not know, a catalog the source cannot read) the run
fails once, before it starts, webhook included."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

from ..base.errors import ReplicatorError
from ..base.redact import redact
from ..plan.selection import expand_project, has_patterns, matched_in_sync_state
from ..postgres.database import connect
from ..project.project import Project
from ..report.results import utc_now
from ..report.webhook import build_payload


def expanded(
    project: Project, names: tuple[str, ...], deliver: Callable[[dict[str, Any]], None]
) -> Project:
    """The project with its patterns matched (see above); `deliver` posts the webhook of a
    run that fails before it starts."""
    if project.expanded or not has_patterns(project):
        return project
    started_at, url = utc_now(), project.connections().source
    try:
        source = connect(url, "source")
    except ReplicatorError as exc:
        known = _from_sync_state(project, names)
        if known is not None:
            return known
        _failed(started_at, exc, deliver)
        raise
    try:
        with source:
            return expand_project(project, source)
    except ReplicatorError as exc:
        _failed(started_at, exc, deliver)
        raise


def _from_sync_state(project: Project, names: tuple[str, ...]) -> Project | None:
    """The patterns matched against the tables sync-state knows; None when a pattern gets
    none there or a table named is not among them."""
    known = matched_in_sync_state(project)
    if known.unmatched:
        return None
    try:
        known.select(names)
    except ReplicatorError:
        return None
    return known


def _failed(
    started_at: str, exc: ReplicatorError, deliver: Callable[[dict[str, Any]], None]
) -> None:
    error = redact(f"{exc}: the table patterns cannot be matched")
    deliver(build_payload(uuid.uuid4().hex, started_at, utc_now(), [], "failure", error))
