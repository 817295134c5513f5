"""Session settings pinned on every connection, so every value prints the same text.

Kept free of heavy imports: Spark's Python workers import it for each COPY task.
"""

from __future__ import annotations

from collections.abc import Mapping

# Settings that change how values are printed as text: pinned on both sides, so the
# text hashed and compared (md5 of every row, cursors) is the same whatever the servers say.
SESSION_SETTINGS: Mapping[str, str] = {
    "DateStyle": "ISO, YMD",
    "IntervalStyle": "postgres",
    "TimeZone": "UTC",
    "extra_float_digits": "3",
    "bytea_output": "hex",
    "lc_monetary": "C",
}
