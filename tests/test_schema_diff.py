"""The pure schema diff: every change kind, its description and the SQL it renders."""

from __future__ import annotations

import pytest

from replicator.base.identifiers import TableName
from replicator.plan.schema_diff import describe, diff
from replicator.plan.signature import Signature, SignedColumn

TARGET = TableName("Sales EU", 'Order"s')
T = '"Sales EU"."Order""s"'


def _sig(*columns, key=("id",), oid=100, rk="updated_at", types=None) -> Signature:
    return Signature(oid, tuple(columns), tuple(key), rk, types or {})


ID = SignedColumn("id", "bigint", True, 1)
AMOUNT = SignedColumn("amount", "numeric(10,2)", False, 2)
NOTE = SignedColumn("note", "text", False, 3)
MOOD = SignedColumn("mood", "public.mood", False, 4)
BASE = _sig(ID, AMOUNT, NOTE, types={"public.mood": {"kind": "enum", "labels": ["a", "b"]}})


@pytest.mark.parametrize(
    ("new", "description", "rendered"),
    [
        pytest.param(
            _sig(ID, AMOUNT, NOTE, SignedColumn("Région ✓", "character varying(5)", True, 4)),
            'column added: "Région ✓" character varying(5) NOT NULL',
            f'ALTER TABLE {T} ADD COLUMN "Région ✓" character varying(5) NOT NULL',
            id="column-added",
        ),
        pytest.param(
            _sig(ID, AMOUNT),
            "column dropped: note",
            f'ALTER TABLE {T} DROP COLUMN "note"',
            id="column-dropped",
        ),
        pytest.param(
            _sig(ID, AMOUNT, SignedColumn('No"te', "text", False, 3)),
            'column renamed: note -> "No""te"',
            f'ALTER TABLE {T} RENAME COLUMN "note" TO "No""te"',
            id="column-renamed",
        ),
        pytest.param(
            _sig(ID, SignedColumn("amount", "numeric(12,2)", False, 2), NOTE),
            "type changed: amount numeric(10,2) -> numeric(12,2)",
            f'ALTER TABLE {T} ALTER COLUMN "amount" SET DATA TYPE numeric(12,2)',
            id="type-widened",
        ),
        pytest.param(
            _sig(ID, SignedColumn("amount", "public.money_d[]", False, 2), NOTE),
            "type changed: amount numeric(10,2) -> public.money_d[]",
            f'ALTER TABLE {T} ALTER COLUMN "amount" SET DATA TYPE public.money_d[]',
            id="type-user-defined",
        ),
        pytest.param(
            _sig(ID, SignedColumn("amount", "numeric(10,2)", True, 2), NOTE),
            "nullability changed: amount is now NOT NULL",
            f'ALTER TABLE {T} ALTER COLUMN "amount" SET NOT NULL',
            id="set-not-null",
        ),
        pytest.param(
            _sig(SignedColumn("id", "bigint", False, 1), AMOUNT, NOTE),
            "nullability changed: id is now nullable",
            f'ALTER TABLE {T} ALTER COLUMN "id" DROP NOT NULL',
            id="drop-not-null",
        ),
        pytest.param(
            _sig(ID, AMOUNT, NOTE, key=("id", "amount")),
            "primary key changed: (id) -> (id, amount)",
            f'ALTER TABLE {T} DROP CONSTRAINT "Order""s_pkey", ADD PRIMARY KEY ("id", "amount")',
            id="primary-key-changed",
        ),
        pytest.param(
            _sig(ID, AMOUNT, NOTE, rk="amount"),
            "replication key changed: updated_at -> amount",
            None,
            id="replication-key-changed",
        ),
        pytest.param(
            _sig(
                ID,
                AMOUNT,
                NOTE,
                types={"public.mood": {"kind": "enum", "labels": ["a", "b", "it's"]}},
            ),
            "enum label added: public.mood 'it''s'",
            """ALTER TYPE "public"."mood" ADD VALUE 'it''s'""",
            id="enum-label-added",
        ),
        pytest.param(
            _sig(ID, AMOUNT, NOTE, types={"public.mood": {"kind": "enum", "labels": ["b", "a"]}}),
            "type definition changed: public.mood (enum labels renamed, removed or reordered)",
            None,
            id="enum-reordered",
        ),
    ],
)
def test_each_change_kind_describes_and_renders_itself(new, description, rendered):
    (change,) = diff(BASE, new)
    assert change.describe() == description
    expression = change.expression(TARGET)
    assert (expression.sql(dialect="postgres") if expression is not None else None) == rendered


def test_a_recreated_table_is_compared_by_column_name():
    # A new table renumbers its columns: attnum 3 is now `amount`, yet nothing was renamed.
    recreated = _sig(
        SignedColumn("id", "bigint", True, 1),
        SignedColumn("note", "text", False, 2),
        SignedColumn("amount", "numeric(10,2)", False, 3),
        oid=200,
    )
    assert describe(diff(BASE, recreated)) == (
        "table recreated: dropped and created again (oid 100 -> 200); "
        "columns reordered: (id, amount, note) -> (id, note, amount)"
    )


def test_a_column_dropped_and_added_again_is_not_a_rename():
    again = _sig(ID, AMOUNT, SignedColumn("note", "text", False, 7))
    assert describe(diff(BASE, again)) == "column dropped: note; column added: note text"


def test_the_first_state_format_compares_by_name():
    stored = Signature.from_json(
        {
            "table_oid": 100,
            "columns": [["id", "bigint", True], ["amount", "numeric(10,2)", False]],
            "primary_key": ["id"],
            "replication_key": "updated_at",
        }
    )
    assert diff(stored, _sig(ID, AMOUNT)) == []
    assert describe(diff(stored, _sig(ID, AMOUNT, NOTE))) == "column added: note text"


def test_a_signature_round_trips_through_json():
    assert Signature.from_json(BASE.as_json()) == BASE
    assert diff(BASE, BASE) == []


def test_the_created_table_has_its_key_columns_not_null():
    nullable_key = _sig(SignedColumn("id", "bigint", False, 1), NOTE)
    created = nullable_key.as_created()
    assert created.columns[0] == SignedColumn("id", "bigint", True)
    assert created.table_oid is None and created.types == {}
