"""A Spark Connect server's URL (`spark.remote`, REPLICATOR_SPARK_REMOTE, the warm server),
checked when the settings are read: a bad one is a config error before anything runs."""

from __future__ import annotations

import json
from dataclasses import dataclass
from urllib.parse import urlsplit

from ..base.errors import ConfigError
from ..base.redact import register_secret

DEFAULT_PORT = 15002


@dataclass(frozen=True)
class Remote:
    """Where a Connect URL points: `sc://host[:port][/;param=value;...]`."""

    url: str
    host: str
    port: int

    @classmethod
    def parse(cls, url: str, where: str = "spark.remote") -> Remote:
        _register_token(url)  # before any message can quote the URL
        parts = urlsplit(url)
        if parts.scheme != "sc" or not parts.hostname:
            raise ConfigError(
                [
                    f"{where} must be a Spark Connect URL like sc://host:{DEFAULT_PORT}, "
                    f"got {json.dumps(url)}"
                ]
            )
        try:
            port = parts.port or DEFAULT_PORT
        except ValueError:
            raise ConfigError(
                [f"{where} has a port that is not a number: {json.dumps(url)}"]
            ) from None
        return cls(url, parts.hostname, port)

    def __str__(self) -> str:
        return f"sc://{self.host}:{self.port}"


def _register_token(url: str) -> None:
    """A `;token=...` parameter is a secret: never printed."""
    for param in url.split(";")[1:]:
        name, _, value = param.partition("=")
        if name.strip().lower() == "token":
            register_secret(value.strip())


def checked_url(url: str) -> str:
    """tables-config.json's `spark.remote` (a pydantic validator: ValueError)."""
    try:
        Remote.parse(url)
    except ConfigError as exc:
        raise ValueError(
            "expected " + exc.problems[0].removeprefix("spark.remote must be ")
        ) from None
    return url
