"""Log lines for people (timestamped text) or for log shippers (one JSON object per line),
and the command's own informational lines (`say`), which follow the same `--log-format` and
`-q`.

Every record and line passes through `redact` on its way out, whatever produced it.
"""

from __future__ import annotations

import json
import logging
import sys
from datetime import UTC, datetime
from typing import Any

import click

from ..base.redact import redact

LOGGER = "replicator"

_mode = {"format": "text", "quiet": False}


def json_output() -> bool:
    """--log-format json: everything the command prints is JSON."""
    return _mode["format"] == "json"


def quiet() -> bool:
    """-q: warnings and errors only."""
    return bool(_mode["quiet"])


def say(text: str, event: str, **fields: Any) -> None:
    """An informational line on stdout (`wrote ...`, `marked for a full reload`): a JSON
    object under --log-format json, nothing under -q."""
    if quiet():
        return
    if json_output():
        text = json.dumps({"event": event, "message": text, **fields}, ensure_ascii=False)
    click.echo(redact(text))


def error_line(message: str, exit_code: int) -> str:
    """How a command's final error is printed on stderr."""
    if json_output():
        event = {
            "time": datetime.now(UTC).isoformat(),
            "level": "error",
            "event": "command.failed",
            "message": message,
            "exit_code": exit_code,
        }
        return redact(json.dumps(event, ensure_ascii=False))
    return redact(f"error: {message}")


class _TextFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        stamp = datetime.fromtimestamp(record.created, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        text = f"{stamp} {record.levelname.lower():<7} {record.getMessage()}"
        if record.exc_info:
            text += "\n" + self.formatException(record.exc_info)
        return redact(text)


class _JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        event = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(),
            "level": record.levelname.lower(),
            "message": record.getMessage(),
            **getattr(record, "fields", {}),
        }
        if record.exc_info:
            event["traceback"] = self.formatException(record.exc_info)
        return redact(json.dumps(event, ensure_ascii=False, default=str))


def configure_logging(verbose: int = 0, quiet: bool = False, log_format: str = "text") -> None:
    """Send the tool's log records to stderr in the chosen format."""
    _mode.update(format=log_format, quiet=quiet)
    logger = logging.getLogger(LOGGER)
    logger.handlers.clear()
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_JsonFormatter() if log_format == "json" else _TextFormatter())
    logger.addHandler(handler)
    logger.propagate = False
    logger.setLevel(logging.DEBUG if verbose else logging.WARNING if quiet else logging.INFO)
    # Libraries' own records (psycopg's "error ignored in rollback", py4j's broken calls when
    # a run is interrupted) and Python warnings (pyspark's Connect client warns when it gives
    # up on a server) would reach stderr unformatted: their warnings under -v, their chatter
    # (every connection poll, every py4j command) only under -vv; redacted.
    logging.captureWarnings(True)
    library_level = {0: logging.CRITICAL, 1: logging.WARNING}.get(verbose, logging.DEBUG)
    for name in ("psycopg", "py4j", "py.warnings"):
        library = logging.getLogger(name)
        library.handlers.clear()
        library.addHandler(handler if verbose else logging.NullHandler())
        library.propagate = False
        library.setLevel(library_level)
    # py4j logs a broken call with the module-level `logging.exception`, which would give the
    # root logger a bare stderr handler (basicConfig) unless it already has one.
    root = logging.getLogger()
    if not root.handlers:
        root.addHandler(handler if verbose else logging.NullHandler())
