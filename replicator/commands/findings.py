"""One line of `check`: what was found, about what, and how to fix it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Level = Literal["ok", "warn", "error"]


@dataclass(frozen=True)
class Finding:
    level: Level
    subject: str
    message: str
    fix: str | None = None

    def line(self) -> str:
        text = f"{self.level:<5} {self.subject}: {self.message}"
        return f"{text}; fix: {self.fix}" if self.fix else text
