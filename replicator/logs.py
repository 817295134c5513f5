"""Log lines for people (timestamped text) or for log shippers (one JSON object per line).

Every record passes through `redact` on its way out, whatever produced it.
"""

from __future__ import annotations

import json
import logging
import sys
from datetime import UTC, datetime

from .redact import redact

LOGGER = "replicator"


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
    logger = logging.getLogger(LOGGER)
    logger.handlers.clear()
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_JsonFormatter() if log_format == "json" else _TextFormatter())
    logger.addHandler(handler)
    logger.propagate = False
    logger.setLevel(logging.DEBUG if verbose else logging.WARNING if quiet else logging.INFO)
