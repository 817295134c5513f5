"""Connection strings and overrides, from the environment or else `<project>/.env`.

Passwords live here, never in tables-config.json or sync-state; every value read is
registered with `redact` before anything can print it.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from dotenv import dotenv_values
from psycopg.conninfo import conninfo_to_dict

from .errors import ConfigError
from .redact import redact, register_connection_string, register_secret

SOURCE_URL = "REPLICATOR_SOURCE_URL"
DEST_URL = "REPLICATOR_DEST_URL"
WEBHOOK_URL = "REPLICATOR_WEBHOOK_URL"
WEBHOOK_SECRET = "REPLICATOR_WEBHOOK_SECRET"
SPARK_MASTER = "REPLICATOR_SPARK_MASTER"
SPARK_MIN_ROWS = "REPLICATOR_SPARK_MIN_ROWS"


@dataclass(frozen=True)
class Environment:
    """The process environment layered over `<project>/.env` (the environment wins)."""

    values: Mapping[str, str]
    dotenv_path: Path

    @classmethod
    def load(cls, project_dir: Path) -> Environment:
        path = project_dir / ".env"
        file_values: dict[str, str] = {}
        if path.is_file():
            file_values = {k: v for k, v in dotenv_values(path).items() if v is not None}
        merged = {**file_values, **{k: v for k, v in os.environ.items() if v != ""}}
        for name in (WEBHOOK_SECRET, "PGPASSWORD"):
            register_secret(merged.get(name))
        for name in (SOURCE_URL, DEST_URL):
            register_connection_string(merged.get(name))
        return cls(merged, path)

    def get(self, name: str) -> str | None:
        return self.values.get(name)

    def connection(self, name: str) -> str:
        """A libpq connection string, checked for syntax; exit 2 when missing or malformed."""
        value = self.values.get(name)
        if not value:
            raise ConfigError(
                [
                    f"{name} is not set: export it or add it to {self.dotenv_path} "
                    f"(a libpq URI such as postgresql://user@host:5432/db, or key=value pairs)"
                ]
            )
        try:
            conninfo_to_dict(value)
        except Exception as exc:
            raise ConfigError(
                [f"{name} is not a valid libpq connection string: {redact(str(exc).strip())}"]
            ) from None
        return value


@dataclass(frozen=True)
class Connections:
    """The two databases a sync talks to."""

    source: str
    destination: str

    @classmethod
    def from_environment(cls, env: Environment) -> Connections:
        problems: list[str] = []
        urls: dict[str, str] = {}
        for name in (SOURCE_URL, DEST_URL):
            try:
                urls[name] = env.connection(name)
            except ConfigError as exc:
                problems.extend(exc.problems)
        if problems:
            raise ConfigError(problems)
        return cls(urls[SOURCE_URL], urls[DEST_URL])
