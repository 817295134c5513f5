"""The per-table plan: pure, one case per reason the webhook contract pins."""

from __future__ import annotations

import pytest

from replicator.plan import Plan, plan_table
from replicator.state import Cursor, TableState

SYNCED = TableState(
    table="public.t",
    cursor=Cursor(value="42", type="bigint"),
    last_synced_at="2026-11-20T00:00:00Z",
)


@pytest.mark.parametrize(
    ("mode", "state", "kwargs", "expected"),
    [
        pytest.param(
            "full-refresh",
            SYNCED,
            {},
            Plan("full_reload", "mode full-refresh"),
            id="mode-full-refresh",
        ),
        pytest.param(
            "incremental-deduped",
            SYNCED,
            {"full_refresh": True},
            Plan("full_reload", "--full-refresh"),
            id="flag",
        ),
        pytest.param(
            "incremental-deduped", None, {}, Plan("full_reload", "no state"), id="no-state"
        ),
        pytest.param(
            "incremental-deduped",
            SYNCED.model_copy(update={"pending_full_reload": True}),
            {},
            Plan("full_reload", "refresh requested"),
            id="refresh-requested",
        ),
        pytest.param(
            "incremental-append",
            SYNCED,
            {"destination_exists": False},
            Plan("full_reload", "destination table missing"),
            id="dest-missing",
        ),
        pytest.param(
            "incremental-deduped",
            SYNCED,
            {"schema_change": "column added: x int"},
            Plan("full_reload", "schema changed: column added: x int"),
            id="schema",
        ),
        pytest.param(
            "incremental-deduped", SYNCED, {}, Plan("incremental", "cursor 42"), id="incremental"
        ),
        pytest.param(
            "incremental-deduped",
            SYNCED.model_copy(update={"cursor": None}),
            {},
            Plan("incremental", "cursor none (source was empty)"),
            id="empty-source",
        ),
        pytest.param(
            "incremental-deduped",
            TableState(table="public.t", pending_full_reload=True),
            {},
            Plan("full_reload", "refresh requested"),
            id="refresh-before-first",
        ),
        pytest.param(
            "incremental-deduped",
            SYNCED,
            {"schema_change": "column dropped: x", "on_schema_change": "fail"},
            Plan("fail", "schema changed: column dropped: x"),
            id="schema-policy-fail",
        ),
        pytest.param(
            "incremental-deduped",
            SYNCED,
            {
                "schema_change": "column dropped: x",
                "on_schema_change": "fail",
                "full_refresh": True,
            },
            Plan("full_reload", "--full-refresh"),
            id="explicit-reload-beats-policy-fail",
        ),
        pytest.param(
            "incremental-deduped",
            SYNCED,
            {"destination_change": "column added: mine integer"},
            Plan("full_reload", "destination table altered: column added: mine integer"),
            id="destination-altered",
        ),
        pytest.param(
            "incremental-deduped",
            None,
            {"initial_load": "skip"},
            Plan("skip_backfill", "no state: initial_load skip"),
            id="skip-backfill",
        ),
        pytest.param(
            "incremental-deduped",
            TableState(table="public.t", pending_full_reload=True),
            {"initial_load": "skip"},
            Plan("full_reload", "refresh requested"),
            id="refresh-beats-skip-backfill",
        ),
    ],
)
def test_plan(mode, state, kwargs, expected):
    assert plan_table(mode, state, **kwargs) == expected
