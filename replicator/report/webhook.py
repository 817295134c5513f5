"""The run's notification: one signed JSON POST after every sync, success or not.

Retried on 5xx answers, timeouts and refused connections (at least 3 attempts within
60 s); a webhook that never answers is logged and never changes the exit code. The URL
itself may be a secret (Slack's are): logs show only its scheme and host.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from .. import __version__
from ..project.settings import WebhookTarget
from .results import TableResult

if TYPE_CHECKING:  # verify's; a sync's payload never loads it
    from ..compare.verdict import Verdict

log = logging.getLogger(__name__)

SIGNATURE_HEADER = "X-Replicator-Signature"
ATTEMPTS = 4
TIMEOUT_SECONDS = 10.0
RETRY_WAIT_SECONDS = 1.0  # first wait; doubles, at most 8 s; tests shorten it


class _Retryable(Exception):
    """A 5xx answer: worth another attempt."""


def sign(body: bytes, secret: str) -> str:
    """`sha256=<hex HMAC-SHA256 of the raw body>`, the X-Replicator-Signature value."""
    return "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


def build_payload(
    run_id: str,
    started_at: str,
    finished_at: str,
    results: list[TableResult],
    status: str | None = None,
    error: str | None = None,
    warnings: list[str] | None = None,
    skipped: list[str] | None = None,
) -> dict[str, Any]:
    """The payload docs/guides/webhook.md pins; `status` is success, failure,
    interrupted, or skipped (lock held); `warnings`: what the run warned about that needs
    someone (a replication slot holding too much WAL), whatever the status; `skipped`: the
    tables a run cut short did not start (`sync --follow` stopping)."""
    failed = [r for r in results if r.status == "failure"]
    overall = status or ("failure" if failed else "success")
    tables = [
        {
            "name": r.name,
            "status": r.status,
            "action": r.action,
            "rows": r.rows,
            "reason": r.reason,
            "error": r.error,
            "duration_seconds": round(r.seconds, 3),
            "cursor_from": r.cursor_from,
            "cursor_to": r.cursor_to,
            "deleted": r.deleted,
            # a table that keeps history: the versions the run began and ended
            **(
                {"versions_added": r.versions_added, "versions_closed": r.versions_closed}
                if r.versions_added is not None
                else {}
            ),
        }
        for r in results
    ]
    total = len(results) + len(skipped or [])
    text = f"replicator sync {overall}: {len(results) - len(failed)} of {total} table(s) ok"
    if skipped:
        text += f", {len(skipped)} skipped"
    if failed:
        text += "; failed: " + ", ".join(f"{r.name} ({r.error})" for r in failed)
    if error:
        text += f"; {error}"
    for warning in warnings or []:
        text += f"; warning: {warning}"
    payload: dict[str, Any] = {
        "event": "sync.finished",
        "status": overall,
        "run_id": run_id,
        "started_at": started_at,
        "finished_at": finished_at,
        "tables": tables,
        "warnings": list(warnings or []),
        "text": text,
    }
    if error:
        payload["error"] = error
    if skipped:
        payload["skipped"] = list(skipped)
    return payload


def post(target: WebhookTarget, payload: dict[str, Any], within: float = 60.0) -> str | None:
    """Deliver the payload, retrying for up to `within` seconds. Never raises: returns None
    when the receiver answered 2xx, else what went wrong (also logged)."""
    body = json.dumps(payload, ensure_ascii=False).encode()
    headers = {"Content-Type": "application/json", "User-Agent": f"replicator/{__version__}"}
    if target.secret:
        headers[SIGNATURE_HEADER] = sign(body, target.secret)
    where = _safe_url(target.url)
    import requests  # here: imports a run without a webhook does not pay
    from tenacity import RetryError

    try:
        _send(target.url, body, headers, within)
    except (RetryError, requests.RequestException, _Retryable) as exc:
        cause = exc.last_attempt.exception() if isinstance(exc, RetryError) else exc
        problem = f"webhook to {where} failed after retries: {_scrub(_describe(cause), target.url)}"
    except _Rejected as exc:
        problem = f"webhook to {where} rejected: HTTP {exc.args[0]}"
    else:
        log.info("webhook delivered to %s", where)
        return None
    log.error("%s", problem)
    return problem


class _Rejected(Exception):
    """A 4xx answer: retrying will not help."""


def _send(url: str, body: bytes, headers: dict[str, str], within: float) -> None:
    import requests
    from tenacity import (
        retry,
        retry_if_exception_type,
        stop_after_attempt,
        stop_after_delay,
        wait_exponential,
    )

    @retry(
        retry=retry_if_exception_type((_Retryable, requests.ConnectionError, requests.Timeout)),
        stop=stop_after_attempt(ATTEMPTS) | stop_after_delay(within),
        wait=wait_exponential(multiplier=RETRY_WAIT_SECONDS, max=8),
    )
    def attempt() -> None:
        answer = requests.post(
            url, data=body, headers=headers, timeout=min(TIMEOUT_SECONDS, within)
        )
        if answer.status_code >= 500:
            raise _Retryable(f"HTTP {answer.status_code}")
        if answer.status_code >= 400:
            raise _Rejected(answer.status_code)

    attempt()


def _safe_url(url: str) -> str:
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.hostname}" + (f":{parts.port}" if parts.port else "")


def _scrub(text: str, url: str) -> str:
    """Remove the URL's path and query (often its secret) from an error message."""
    parts = urlsplit(url)
    for secret in (url, parts.path + (f"?{parts.query}" if parts.query else ""), parts.path):
        if len(secret) > 1:
            text = text.replace(secret, "/***")
    return text


def _describe(exc: BaseException | None) -> str:
    if exc is None:
        return "unknown error"
    text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    return f"{type(exc).__name__}: {text}"[:300]


def build_verify_payload(
    run_id: str,
    started_at: str,
    finished_at: str,
    verdicts: list[Verdict],
    repair: bool,
) -> dict[str, Any]:
    """`verify.finished`: the per-table objects `verify --json` prints. `status` is success
    when every table is equal (or, with --repair, was repaired), else failure."""
    bad = [v for v in verdicts if not v.fixed]
    overall = "failure" if bad else "success"
    text = f"replicator verify{' --repair' if repair else ''} {overall}: "
    text += f"{len(verdicts) - len(bad)} of {len(verdicts)} table(s) equal"
    if bad:
        text += "; " + ", ".join(
            f"{v.name} ({v.error})"
            if v.status == "failed"
            else f"{v.name} ({v.differences} rows differ)"
            for v in bad
        )
    return {
        "event": "verify.finished",
        "status": overall,
        "run_id": run_id,
        "started_at": started_at,
        "finished_at": finished_at,
        "repair": repair,
        "tables": [v.as_dict() for v in verdicts],
        "text": text,
    }
