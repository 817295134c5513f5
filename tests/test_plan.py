"""The per-table plan: pure, one case per reason the webhook contract pins."""

from __future__ import annotations

import pytest

from replicator.plan.decide import Plan, plan_table
from replicator.postgres.ownership import Records, classify
from replicator.project.state import Cursor, TableState

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
            {"schema_change": "column dropped: x", "on_schema_change": "fail", "name": "t"},
            Plan(
                "fail",
                "schema changed: column dropped: x",
                'on_schema_change is "fail": review the change, then reload the table with '
                "`replicator sync -f -s t`",
            ),
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
        *[
            pytest.param(
                mode,
                state,
                {"not_owned": "FIX", **kwargs},
                Plan("fail", "destination table exists and was not created by replicator", "FIX"),
                id=f"not-owned-{case}",
            )
            for case, mode, state, kwargs in [
                ("first-load", "incremental-deduped", None, {}),
                ("full-refresh-mode", "full-refresh", SYNCED, {}),
                ("flag", "incremental-deduped", SYNCED, {"full_refresh": True}),
                ("incremental", "incremental-append", SYNCED, {}),
                (
                    "skip-with-flag",
                    "incremental-deduped",
                    None,
                    {"initial_load": "skip", "full_refresh": True},
                ),
            ]
        ],
        pytest.param(
            "incremental-deduped",
            None,
            {"initial_load": "skip", "not_owned": "FIX"},
            Plan("skip_backfill", "no state: initial_load skip"),
            id="not-owned-skip-backfill-adopts",
        ),
    ],
)
def test_plan(mode, state, kwargs, expected):
    assert plan_table(mode, state, **kwargs) == expected


LOADED = SYNCED.model_copy(update={"schema_signature": {"columns": []}})


@pytest.mark.parametrize(
    ("exists", "records", "state", "expected"),
    [
        pytest.param(False, Records(False, False), None, "missing", id="missing"),
        pytest.param(True, Records(True, True), None, "owned", id="recorded"),
        pytest.param(True, Records(False, False), None, "foreign", id="hand-made-first-sync"),
        pytest.param(True, Records(False, False), LOADED, "legacy", id="loaded-before-records"),
        pytest.param(True, Records(False, True), LOADED, "foreign", id="ours-replaced-by-hand"),
        pytest.param(
            True,
            Records(False, False),
            TableState(table="public.t", pending_full_reload=True),
            "foreign",
            id="state-without-a-load",
        ),
    ],
)
def test_ownership(exists, records, state, expected):
    assert classify(exists, records, state) == expected
