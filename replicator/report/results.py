"""What a run did to each table: the record behind the summary, the logs and the webhook."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from typing import Any, Literal

Status = Literal["success", "failure"]


def utc_now() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


@dataclass(frozen=True)
class TableResult:
    name: str
    status: Status
    action: str | None
    rows: int | None
    reason: str | None
    error: str | None
    seconds: float
    bytes: int | None = None
    cursor_from: str | None = None
    cursor_to: str | None = None
    deleted: int = 0  # rows deleted here because the source no longer has them
    marked: bool = False  # `deletes: mark`: they were marked deleted, not deleted
    # a table that keeps history (tables[].history): the versions the run began and ended
    versions_added: int | None = None
    versions_closed: int | None = None

    def as_dict(self) -> dict[str, Any]:
        return {
            k: v
            for k, v in asdict(self).items()
            if k != "marked" and not (k.startswith("versions_") and v is None)
        }

    def line(self) -> str:
        """One log line: what happened, how much, how fast, and why."""
        if self.status == "failure":  # its error may name the table too: said once
            error = (self.error or "").removeprefix(f"{self.name}: ")
            return f"{self.name}: failed after {self.seconds:.1f} s: {error}"
        text = f"{self.name}: {self.action}"
        if self.rows is not None:
            text += f", {self.rows:,} rows"
        if self.bytes:
            text += f", {self.bytes / 1e6:,.1f} MB"
        if self.deleted:
            text += f", {self.deleted:,} {'marked deleted' if self.marked else 'deleted'}"
        if self.versions_added is not None:
            text += (
                f", history: {self.versions_added:,} version(s) added, "
                f"{self.versions_closed or 0:,} closed"
            )
        text += f" in {self.seconds:.1f} s"
        if self.rows and self.seconds > 0:
            text += f" ({self.rows / self.seconds:,.0f} rows/s)"
        return f"{text}; reason: {self.reason}"
