"""Whether a sync run sends OpenLineage events, and the three calls of the run loop: a
table's load began (`started`), a table is done (`finished`), the run ends (`close`).

Configured only as the OpenLineage client configures itself (`OPENLINEAGE_URL`,
`OPENLINEAGE__TRANSPORT__*`, `OPENLINEAGE_CONFIG`, an `openlineage.yml` in the working folder
or `~/.openlineage/`), with two additions: the project's `.env` may set those variables (the
client reads only the process environment: they are layered over it while it reads them),
and the project folder may hold the `openlineage.yml`. Unconfigured, or with
`OPENLINEAGE_DISABLED=true`, a run costs a few `stat` calls: neither the client nor
lineage_events.py (the events and their sending) is imported.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from ..plan.drift import Planned
from ..project.project import Project
from .results import TableResult

if TYPE_CHECKING:
    from .lineage_events import RunEvents

CONFIG_FILE = "openlineage.yml"
PREFIX = "OPENLINEAGE"


def configured(values: Mapping[str, str], root: Path) -> bool:
    """Whether the OpenLineage client would find a configuration (`values`: the process
    environment over `.env`), or the project folder holds an `openlineage.yml`."""
    if values.get("OPENLINEAGE_DISABLED", "").strip().lower() == "true":
        return False
    if values.get("OPENLINEAGE_URL") or any(k.startswith("OPENLINEAGE__TRANSPORT") for k in values):
        return True
    files = (
        values.get("OPENLINEAGE_CONFIG"),
        root / CONFIG_FILE,
        CONFIG_FILE,  # the working folder's, as the client looks (none when it was removed)
        os.path.expanduser(f"~/.openlineage/{CONFIG_FILE}"),
    )
    return any(f and os.path.isfile(f) for f in files)


def client_settings(values: Mapping[str, str], root: Path) -> dict[str, str]:
    """The OPENLINEAGE_* variables for the client: the environment's over .env's, and the
    project folder's openlineage.yml unless OPENLINEAGE_CONFIG names a file already."""
    settings = {k: v for k, v in values.items() if k.startswith(PREFIX)}
    if "OPENLINEAGE_CONFIG" not in settings and (root / CONFIG_FILE).is_file():
        settings["OPENLINEAGE_CONFIG"] = str(root / CONFIG_FILE)
    return settings


class RunLineage:
    """A sync run's OpenLineage events; every call does nothing when none is configured."""

    def __init__(self, events: RunEvents | None = None) -> None:
        self._events = events

    @classmethod
    def for_run(cls, project: Project, run_id: str) -> RunLineage:
        values = project.env.values
        if not configured(values, project.root):
            return cls()
        from .lineage_events import RunEvents  # here: a run without OpenLineage does not pay

        return cls(RunEvents.for_run(project, run_id, client_settings(values, project.root)))

    def started(self, planned: Planned) -> None:
        """The table's load begins: its START, with the source's and the copy's columns."""
        if self._events is not None:
            self._events.started(planned)

    def finished(self, result: TableResult) -> None:
        """The table's COMPLETE or FAIL (and its START first when its load never began)."""
        if self._events is not None:
            self._events.finished(result)

    def close(self, results: list[TableResult]) -> None:
        """The results not told yet, then a bounded wait for the events still unsent."""
        if self._events is not None:
            self._events.close(results)
