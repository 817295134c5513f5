"""Identifier parsing and quoting, checked against PostgreSQL's own parse_ident()."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from psycopg import sql

from replicator.base.identifiers import TableName, display_ident, parse_column, quote_ident


@pytest.mark.parametrize(
    ("text", "schema", "name"),
    [
        pytest.param("public.orders", "public", "orders", id="plain"),
        pytest.param("Public.Orders", "public", "orders", id="folds-case"),
        pytest.param('"Sales ""EU"""."Order.Lines"', 'Sales "EU"', "Order.Lines", id="quotes"),
        pytest.param('s."a.b"', "s", "a.b", id="dot-inside-quotes"),
        pytest.param("ünï.ÀB", "ünï", "Àb", id="unicode-unquoted-folds-ascii-only"),
        pytest.param('"😀 emoji"."select"', "😀 emoji", "select", id="emoji-and-keyword"),
        pytest.param("  a$1 . _b  ", "a$1", "_b", id="dollar-underscore-spaces"),
    ],
)
def test_parse_table_names(text, schema, name):
    assert TableName.parse(text) == TableName(schema, name)


@pytest.mark.parametrize(
    "text",
    [
        "orders",
        "a.b.c",
        '"unterminated.x',
        "1a.b",
        "a b.c",
        "a.",
        '"".a',
        "a.b" + "x" * 64,
        "a.b c",
    ],
)
def test_invalid_table_names(text):
    with pytest.raises(ValueError):
        TableName.parse(text)


def test_columns_and_display():
    assert parse_column('"UpdatedAt"') == "UpdatedAt"
    assert parse_column("UpdatedAt") == "updatedat"
    with pytest.raises(ValueError):
        parse_column("a.b")
    assert display_ident("orders") == "orders"
    assert display_ident("Orders") == '"Orders"'
    assert display_ident("order") == '"order"'  # a keyword: bare, a statement would not parse
    assert str(TableName("public", "user")) == 'public."user"'
    assert str(TableName('Sales "EU"', "x")) == '"Sales ""EU""".x'


identifier_text = st.text(
    alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"),
    min_size=1,
    max_size=20,
).filter(lambda s: len(s.encode()) <= 63)


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(schema=identifier_text, name=identifier_text)
def test_quote_then_parse_matches_postgres(source_conn, schema, name):
    """Whatever the characters, our quoting reads back as PostgreSQL reads it."""
    quoted = TableName(schema, name).sql()
    assert TableName.parse(quoted) == TableName(schema, name)
    (parts,) = source_conn.execute("SELECT parse_ident(%s)", (quoted,)).fetchone()
    assert parts == [schema, name]


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(text=st.text(alphabet='aZ_ "ü.$1', min_size=1, max_size=12))
def test_parsing_agrees_with_postgres_parse_ident(source_conn, text):
    """For any short dotted name, we accept what PostgreSQL accepts, with the same parts."""
    try:
        (theirs,) = source_conn.execute(
            "SELECT parse_ident(%s, strict => true)", (text,)
        ).fetchone()
    except Exception:
        theirs = None
    try:
        ours = TableName.parse(text)
    except ValueError:
        ours = None
    if theirs is not None and len(theirs) == 2:
        assert ours == TableName(*theirs)
    if ours is not None:
        assert theirs == [ours.schema, ours.name]


def test_quoted_names_work_in_real_sql(source_conn, schema):
    """A table named with quotes, dots, spaces, capitals and emoji is created and found."""
    name = TableName(schema, 'Order "Lines".😀 Ü')
    source_conn.execute(f"CREATE TABLE {name.sql()} ({quote_ident('Weird Col')} int)")
    found = source_conn.execute(
        sql.SQL("SELECT count(*) FROM {}").format(sql.Identifier(schema, name.name))
    ).fetchone()
    assert found == (0,)


@pytest.mark.parametrize(
    ("text", "schema", "name", "pattern"),
    [
        ("sales.*", "sales", "*", True),
        ('"Sales".*', "Sales", "*", True),
        ('sales."a*b"', "sales", "a[*]b", False),  # quoted: literal, not a pattern
        ('sales."Orders"*', "sales", "Orders*", True),
        ('Sales."Or""d"2024_*', "sales", 'Or"d2024_*', True),
        (" sales . t_? ", "sales", "t_?", True),
    ],
)
def test_pattern_parts_join_quoted_and_unquoted_pieces(text, schema, name, pattern):
    from replicator.base.name_patterns import NamePattern, is_pattern

    assert is_pattern(text) is pattern
    parsed = NamePattern.parse(text)
    assert (parsed.schema, parsed.name) == (schema, name)


@pytest.mark.parametrize("text", ['sales.""*', 'sales."Orders*', "sales.Or ders*", "sales.*.x"])
def test_broken_patterns_are_refused(text):
    from replicator.base.name_patterns import NamePattern

    with pytest.raises(ValueError):
        NamePattern.parse(text)
