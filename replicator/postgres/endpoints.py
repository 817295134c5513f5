"""The two databases one table's work talks to: open connections for the catalog and small
statements, URLs for what opens its own (snapshots, Spark tasks, locks)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import psycopg


@dataclass(frozen=True)
class Endpoints:
    source: psycopg.Connection[Any]
    dest: psycopg.Connection[Any]
    source_url: str
    dest_url: str
