"""What `verify` says of one table: the object `verify --json` prints and the
`verify.finished` webhook carries (docs/guides/verify.md)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from .history_check import HistoryFindings

MAX_EXAMPLES = 10
REPEATED_KEY = "repeated_key"  # an example's kind: a key on more than one source row

VerdictStatus = Literal["equal", "different", "failed"]


@dataclass(frozen=True)
class Verdict:
    name: str
    status: VerdictStatus
    rows_compared: int = 0
    missing: int = 0  # in the source, not in the destination
    extra: int = 0  # in the destination, not in the source
    different: int = 0  # same key, other values
    not_yet_synced: int = 0  # changed in the source after the last sync: not a difference
    repaired: int = 0
    repeated_keys: int = 0  # keys on more than one source row (primary_key not unique there)
    examples: list[dict[str, Any]] = field(default_factory=list)  # {"key": {...}, "kind": ...}
    error: str | None = None
    seconds: float = 0.0
    history: HistoryFindings | None = None  # its history table's check (history_check.py)

    @property
    def differences(self) -> int:
        return self.missing + self.extra + self.different

    @property
    def fixed(self) -> bool:
        """Equal, or every difference repaired (its history's too)."""
        if self.status != "different":
            return self.status == "equal"
        history = self.history
        history_fixed = history is None or not history.differences or history.repaired > 0
        return self.repaired >= self.differences and history_fixed

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "status": self.status,
            "rows_compared": self.rows_compared,
            "missing": self.missing,
            "extra": self.extra,
            "different": self.different,
            "not_yet_synced": self.not_yet_synced,
            "repaired": self.repaired,
            "repeated_keys": self.repeated_keys,
            "examples": self.examples,
            "error": self.error,
            "duration_seconds": round(self.seconds, 3),
            **({"history": self.history.as_dict()} if self.history is not None else {}),
        }

    def line(self) -> str:
        """One log line: the verdict, the counts, and what was repaired."""
        if self.status == "failed":
            return f"{self.name}: verify failed after {self.seconds:.1f} s: {self.error}"
        text = f"{self.name}: {self.status}, {self.rows_compared:,} rows compared"
        if self.status == "different":
            text += (
                f": {self.missing:,} missing, {self.extra:,} extra, {self.different:,} different"
            )
            if self.repaired:
                text += f", {self.repaired:,} repaired"
        if self.not_yet_synced:
            text += f"; {self.not_yet_synced:,} not yet synced (the next sync brings them in line)"
        text += f" in {self.seconds:.1f} s"
        if self.repeated_keys:
            text += (
                f"; {self.repeated_keys:,} key(s) on more than one source row (the primary key "
                "is not unique in the source): the copy holds one row of each, the newest when "
                "sync copied them, which counts as equal; --repair leaves them, `sync -f` "
                "copies them again"
            )
        if self.history is not None:
            text += f"; {self.history.line()}"
        return f"{text}; {self.error}" if self.error else text
