"""`freshness` in tables-config.json (per table, or a top-level default): how old a copy's
last successful sync may be before dbt's `source freshness` warns or errors.

Written as dbt users say it, a count and a unit (`"1h"`, `"30m"`, `"2d"`, `"600s"`), and
handed to dbt as its `{count, period}`. dbt counts in minutes, hours and days, so seconds
must make whole minutes: `"90s"` is refused with the nearest ways to write it.
"""

from __future__ import annotations

import re
from typing import Annotated, Any

from pydantic import BaseModel, BeforeValidator, ConfigDict, model_validator

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
# dbt's periods, largest first: a duration is written in the largest that divides it
_PERIODS = (("day", 86400), ("hour", 3600), ("minute", 60))
_DURATION = re.compile(r"\s*(\d+)\s*([smhd])\s*")


def _seconds(value: Any) -> int:
    if not isinstance(value, str):
        raise ValueError('expected a duration like "1h" (s, m, h or d)')
    found = _DURATION.fullmatch(value)
    if found is None:
        raise ValueError('expected a duration like "1h", "30m" or "2d" (s, m, h or d)')
    seconds = int(found[1]) * _UNITS[found[2]]
    if seconds <= 0:
        raise ValueError("expected a duration above zero")
    if seconds % 60:
        below, above = seconds // 60, seconds // 60 + 1
        raise ValueError(
            "dbt counts freshness in minutes, hours or days, and this is not whole minutes "
            f'(write "{above}m"' + (f' or "{below}m")' if below else ")")
        )
    return seconds


Duration = Annotated[int, BeforeValidator(_seconds)]


class FreshnessConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    # seconds, parsed from "1h"...; one or both, as dbt takes them
    warn_after: Duration | None = None
    error_after: Duration | None = None

    @model_validator(mode="after")
    def _some_limit(self) -> FreshnessConfig:
        if self.warn_after is None and self.error_after is None:
            raise ValueError('expected warn_after, error_after or both, e.g. {"warn_after": "1h"}')
        if (
            self.warn_after is not None
            and self.error_after is not None
            and self.warn_after >= self.error_after
        ):
            raise ValueError(
                "warn_after must be shorter than error_after: dbt would report the error and "
                "never the warning"
            )
        return self

    def dbt(self) -> dict[str, dict[str, int | str]]:
        """dbt's freshness block: `{"warn_after": {"count": 1, "period": "hour"}, ...}`."""
        return {
            key: _count_and_period(seconds)
            for key, seconds in (("warn_after", self.warn_after), ("error_after", self.error_after))
            if seconds is not None
        }


def _count_and_period(seconds: int) -> dict[str, int | str]:
    for period, size in _PERIODS:
        if seconds % size == 0:
            return {"count": seconds // size, "period": period}
    raise AssertionError(seconds)  # whole minutes, checked when parsed
