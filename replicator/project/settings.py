"""Connection strings and overrides, from the environment or else `<project>/.env`.

Passwords live here, never in tables-config.json or sync-state; every value read is
registered with `redact` before anything can print it.
"""

from __future__ import annotations

import difflib
import json
import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from dotenv import dotenv_values
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from ..base.errors import ConfigError
from ..base.libpq_options import option_setting
from ..base.redact import register_connection_string, register_secret
from .config import ProjectConfig
from .connection_string import option_problems, unparsed, uri_userinfo_problem
from .identity import PROJECT_SETTING
from .metrics_config import textfile_path
from .spark_remote import Remote
from .spark_server_state import ServerState, code_fingerprint, running, settings_fingerprint

SOURCE_URL = "REPLICATOR_SOURCE_URL"
DEST_URL = "REPLICATOR_DEST_URL"
WEBHOOK_URL = "REPLICATOR_WEBHOOK_URL"
WEBHOOK_SECRET = "REPLICATOR_WEBHOOK_SECRET"
SPARK_MASTER = "REPLICATOR_SPARK_MASTER"
SPARK_MIN_ROWS = "REPLICATOR_SPARK_MIN_ROWS"
SPARK_REMOTE = "REPLICATOR_SPARK_REMOTE"
PROGRESS_INTERVAL = "REPLICATOR_PROGRESS_INTERVAL"
# The salt of `tables[].columns.hash`; each source session holds it in SALT_SETTING, so no
# statement (log line, compile output, pg_stat_activity) ever shows it.
HASH_SALT = "REPLICATOR_HASH_SALT"
SALT_SETTING = "replicator.hash_salt"
DEFAULT_PROGRESS_INTERVAL = 10.0


log = logging.getLogger(__name__)

# Every REPLICATOR_* setting the tool reads (the tests' and tools' own included), to catch
# a misspelt one in .env.
KNOWN = frozenset(
    {
        SOURCE_URL,
        DEST_URL,
        WEBHOOK_URL,
        WEBHOOK_SECRET,
        SPARK_MASTER,
        SPARK_MIN_ROWS,
        SPARK_REMOTE,
        PROGRESS_INTERVAL,
        HASH_SALT,
        "REPLICATOR_JDBC_JAR",
        "REPLICATOR_CACHE_DIR",
        "REPLICATOR_PG_BIN",
        "REPLICATOR_FAILPOINT",
        "REPLICATOR_FAILPOINT_ONCE",
    }
)


def _closest(name: str, candidates: list[str]) -> str | None:
    """The candidate that looks like a misspelling of `name` (REPLICATOR_ prefixes aside)."""
    stems = {c.removeprefix("REPLICATOR_"): c for c in candidates}
    close = difflib.get_close_matches(name.removeprefix("REPLICATOR_"), stems, n=1, cutoff=0.75)
    return stems[close[0]] if close else None


def _near_misses(name: str, values: Mapping[str, str]) -> str:
    typo = _closest(name, [k for k in values if k.startswith("REPLICATOR_") and k not in KNOWN])
    return f" ({typo} is set: a typo?)" if typo else ""


# Read before any project is (the cache folder, the warm helper's switch): a project's .env
# cannot set them.
ENVIRONMENT_ONLY = frozenset({"REPLICATOR_CACHE_DIR", "REPLICATOR_WARM"})


def _warn_unknown(file_values: Mapping[str, str], path: Path) -> None:
    for key in file_values:
        if key in ENVIRONMENT_ONLY:
            log.warning(
                "%s: %s is read from the process environment only, not from .env: ignored "
                "here; set it where the command runs (the crontab line, the service)",
                path,
                key,
            )
        elif key.startswith("REPLICATOR_") and key not in KNOWN:
            meant = _closest(key, sorted(KNOWN))
            hint = f"; did you mean {meant}?" if meant else ""
            log.warning("%s: unknown setting %s, ignored%s", path, key, hint)


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
            # No ${VAR} interpolation: a password such as `pa$${HOME}` is read as written.
            values = dotenv_values(path, interpolate=False)
            file_values = {k: v for k, v in values.items() if v is not None}
        _warn_unknown(file_values, path)
        merged = {**file_values, **{k: v for k, v in os.environ.items() if v != ""}}
        for name in (WEBHOOK_SECRET, "PGPASSWORD", HASH_SALT):
            register_secret(merged.get(name))
        for name in (SOURCE_URL, DEST_URL):
            register_connection_string(merged.get(name))
        return cls(merged, path)

    def get(self, name: str) -> str | None:
        return self.values.get(name)

    def connection(self, name: str) -> str:
        """A libpq connection string, checked for syntax; exit 2 when missing or malformed."""
        value = self.optional_connection(name)
        if value is None:
            near = _near_misses(name, self.values)
            raise ConfigError(
                [
                    f"{name} is not set{near}: export it or add it to {self.dotenv_path} "
                    f"(a libpq URI such as postgresql://user@host:5432/db, or key=value pairs)"
                ]
            )
        return value

    def source(self) -> str:
        """The source's connection string, with the hash salt its sessions hash with
        (`salted`): a plan read without it sees every hashed column's salt changed."""
        return salted(self.connection(SOURCE_URL), self.get(HASH_SALT))

    def optional_source(self) -> str | None:
        """`source`, or None when the source's URL is not set."""
        url = self.optional_connection(SOURCE_URL)
        return None if url is None else salted(url, self.get(HASH_SALT))

    def optional_connection(self, name: str) -> str | None:
        """The connection string when set (checked like `connection`), else None."""
        value = self.values.get(name)
        if not value:
            return None
        problem = uri_userinfo_problem(value)
        if problem:
            raise ConfigError([f"{name}: {problem}"])
        try:
            options = conninfo_to_dict(value)
        except Exception as exc:
            problem = f"{name} is not a valid libpq connection string: {unparsed(exc)}"
            raise ConfigError([problem]) from None
        problems = [f"{name}: {p}" for p in option_problems(options)]
        if problems:
            raise ConfigError(problems)
        return value


@dataclass(frozen=True)
class Connections:
    """The two databases a sync talks to."""

    source: str
    destination: str

    @classmethod
    def from_environment(cls, env: Environment, project_id: str | None = None) -> Connections:
        """`project_id`: the project's identity (project/identity.py), which every
        destination session carries (None before the project has one)."""
        problems: list[str] = []
        urls: dict[str, str] = {}
        for name in (SOURCE_URL, DEST_URL):
            try:
                urls[name] = env.connection(name)
            except ConfigError as exc:
                problems.extend(exc.problems)
        if problems:
            raise ConfigError(problems)
        destination = with_setting(urls[DEST_URL], PROJECT_SETTING, project_id)
        return cls(salted(urls[SOURCE_URL], env.get(HASH_SALT)), destination)


def salted(conninfo: str, salt: str | None) -> str:
    """The source's connection string with the hash salt as a session setting (libpq's
    `options`, `-c replicator.hash_salt=...`): every session opened from it, Spark's tasks
    included, hashes with it, and no statement holds it."""
    return with_setting(conninfo, SALT_SETTING, salt)


def with_setting(conninfo: str, name: str, value: str | None) -> str:
    """The connection string with a session setting added to libpq's `options` (none when
    `value` is None or empty)."""
    if not value:
        return conninfo
    options = conninfo_to_dict(conninfo).get("options") or ""
    setting = option_setting(name, value)
    return make_conninfo(conninfo, options=f"{options} {setting}".strip())


@dataclass(frozen=True)
class WebhookTarget:
    """Where the run's notification goes, and the key that signs it."""

    url: str
    secret: str | None = None


@dataclass(frozen=True)
class Settings:
    """Every setting a command uses, resolved once: the environment (or .env) over
    tables-config.json over the defaults. A bad value is a ConfigError (exit 2) when the
    project's settings are first read, before anything is touched."""

    spark_master: str | None
    spark_conf: Mapping[str, str]
    ship_environment: bool
    # spark.min_rows when set; None: the choice follows this host's measurements
    # (spark/engine_choice.py), with or without the warm server.
    min_rows: int | None
    webhook: WebhookTarget | None
    progress_interval: float
    # A Spark Connect server to run on instead of starting Spark: spark.remote, else the
    # project's warm server when it is up (`warm_server`).
    spark_remote: str | None = None
    warm_server: ServerState | None = None
    history_days: int = 90  # of `_replicator.runs`
    metrics_textfile: Path | None = None  # the Prometheus file written after every run

    def unfit(self, server: ServerState) -> str | None:
        """Why the warm server cannot run these settings' tasks (None when it can)."""
        return unfit_server(server, self.spark_master, self.spark_conf, self.ship_environment)

    @classmethod
    def resolve(cls, config: ProjectConfig, env: Environment, root: Path | None = None) -> Settings:
        """`root`: the project's folder, where its warm server is looked up."""
        problems: list[str] = []
        values: dict[str, Any] = {}
        remote, warm = _spark_remote(config, env, root, problems)
        for name, read in (
            ("min_rows", lambda: _min_rows(config, env)),
            ("webhook", lambda: _webhook(config, env)),
            ("progress_interval", lambda: _progress_interval(env)),
            ("metrics_textfile", lambda: textfile_path(config.metrics, root)),
        ):
            try:
                values[name] = read()
            except ConfigError as exc:
                problems.extend(exc.problems)
        if problems:
            raise ConfigError(problems)
        return cls(
            spark_master=env.get(SPARK_MASTER) or config.spark.master,
            spark_conf=dict(config.spark.conf),
            ship_environment=config.spark.ship_environment,
            spark_remote=remote,
            warm_server=warm,
            history_days=config.history_days,
            **values,
        )


def _spark_remote(
    config: ProjectConfig, env: Environment, root: Path | None, problems: list[str]
) -> tuple[str | None, ServerState | None]:
    """REPLICATOR_SPARK_REMOTE over spark.remote over the warm server: (url, the warm
    server when it is the one)."""
    configured = env.get(SPARK_REMOTE) or config.spark.remote
    if configured:
        try:
            Remote.parse(configured, SPARK_REMOTE if env.get(SPARK_REMOTE) else "spark.remote")
        except ConfigError as exc:
            problems.extend(exc.problems)
        return configured, None
    server = running(root) if root is not None else None
    if server is None:
        return None, None
    master = env.get(SPARK_MASTER) or config.spark.master
    unfit = unfit_server(server, master, config.spark.conf, config.spark.ship_environment)
    if unfit:
        log.warning(
            "the warm Spark server was started with %s than this run's, so this run does not "
            "use it: restart it (replicator spark stop, then replicator spark start)",
            unfit,
        )
        return None, None
    return server.url, server


def unfit_server(
    server: ServerState, master: str | None, conf: Mapping[str, str], ship: bool
) -> str | None:
    """Why the warm server cannot run this run's tasks (None when it can)."""
    if server.code != code_fingerprint():
        return "another version of replicator"
    if server.settings != settings_fingerprint(master, conf, ship):
        return "other Spark settings (spark.master, spark.conf) or PG* environment"
    return None


def _min_rows(config: ProjectConfig, env: Environment) -> int | None:
    """spark.min_rows, or REPLICATOR_SPARK_MIN_ROWS when set (a whole number); None when
    neither is set."""
    value = env.get(SPARK_MIN_ROWS)
    if value is None:
        return config.spark.min_rows
    if not value.isdigit():
        raise ConfigError(
            [f"{SPARK_MIN_ROWS} must be a whole number of rows, got {json.dumps(value)}"]
        )
    return int(value)


def _webhook(config: ProjectConfig, env: Environment) -> WebhookTarget | None:
    """webhook.url / .secret, REPLICATOR_WEBHOOK_URL / _SECRET winning."""
    configured = config.webhook
    url = env.get(WEBHOOK_URL) or (configured.url if configured else None)
    if not url:
        return None
    where = WEBHOOK_URL if env.get(WEBHOOK_URL) else "tables-config.json webhook.url"
    problem = _url_problem(url)
    if problem is not None:
        raise ConfigError([f"{where} {problem}"])
    secret = env.get(WEBHOOK_SECRET) or (configured.secret if configured else None)
    register_secret(secret)
    return WebhookTarget(url, secret)


def _url_problem(url: str) -> str | None:
    """Why the webhook could never be sent to `url`, found before anything runs."""
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 (it checks the port: out of range, not a number)
    except ValueError as exc:  # its text may quote the host part, a password's too
        port = "Port" in str(exc) and "'" not in str(exc)  # "Port out of range 0-65535"
        return f"is not a valid URL: {exc if port else 'its host part cannot be read'}"
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return "must be an http:// or https:// URL with a host (https://hooks.example.com/x)"
    return None


def _progress_interval(env: Environment) -> float:
    """Seconds between progress log lines off a terminal (a number > 0)."""
    value = env.get(PROGRESS_INTERVAL)
    if value is None:
        return DEFAULT_PROGRESS_INTERVAL
    try:
        seconds = float(value)
    except ValueError:
        seconds = 0.0
    if not seconds > 0:
        raise ConfigError(
            [f"{PROGRESS_INTERVAL} must be a number of seconds > 0, got {json.dumps(value)}"]
        )
    return seconds
