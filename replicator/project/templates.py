"""Jinja SQL: built-in macros, project macros that shadow them by name, and per-table models.

Every macro name resolves late, through the registry, so a project's `macros/*.sql` that
defines `merge_deduped` replaces the built-in everywhere, including inside other macros.
Rendered SQL is parsed by sqlglot; a syntax error names the file and line.
"""

from __future__ import annotations

import difflib
import functools
import re
from collections.abc import Callable
from dataclasses import dataclass
from importlib import resources
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any

import jinja2
from jinja2 import nodes

from ..base.errors import TemplateError
from ..base.identifiers import TableName, quote_ident

if TYPE_CHECKING:  # sqlglot is loaded when a model's SQL is read: a table without one never
    from sqlglot.tokens import Token, TokenType

MODELS_DIR = "models"
MACROS_DIR = "macros"


@dataclass(frozen=True)
class Model:
    """A table's extraction SELECT, rendered; `origin` is the file it came from."""

    sql: str
    origin: str
    is_default: bool
    # The built-in default_model, not shadowed: a plain SELECT of the source's columns.
    reads_table_as_is: bool = False
    # A model wrapped by the table's `columns` and `where` (plan/shaping.py): the model as
    # written, and what the wrapping does.
    base: Model | None = None
    shaping: str | None = None


class _LazyMacro:
    """Stands for a macro by name; looks the winning definition up when called."""

    def __init__(self, registry: dict[str, Callable[..., str]], name: str) -> None:
        self._registry, self._name = registry, name

    def __call__(self, *args: Any, **kwargs: Any) -> str:
        return str(self._registry[self._name](*args, **kwargs))


class Templates:
    """The Jinja environment of one project."""

    def __init__(self, project_dir: Path) -> None:
        self.project_dir = project_dir
        self.env = jinja2.Environment(
            undefined=jinja2.StrictUndefined, keep_trailing_newline=False, autoescape=False
        )
        self.registry: dict[str, Callable[..., str]] = {}
        self.origins: dict[str, str] = {}
        self.namespace: dict[str, Any] = {"quote": quote_ident}
        sources = [*_builtin_sources(), *self._project_sources()]
        parsed = [(origin, text, self._parse(origin, text)) for origin, text in sources]
        for _, _, tree in parsed:
            for node in tree.find_all(nodes.Macro):
                self.namespace[node.name] = _LazyMacro(self.registry, node.name)
        for origin, text, tree in parsed:  # later sources (the project's) win
            module = self.env.from_string(text, globals=self.namespace).module
            for node in tree.find_all(nodes.Macro):
                self.registry[node.name] = getattr(module, node.name)
                self.origins[node.name] = origin

    def _project_sources(self) -> list[tuple[str, str]]:
        folder = self.project_dir / MACROS_DIR
        if not folder.is_dir():
            return []
        return [(str(p), p.read_text(encoding="utf-8")) for p in sorted(folder.rglob("*.sql"))]

    def _parse(self, origin: str, text: str) -> nodes.Template:
        try:
            return self.env.parse(text)
        except jinja2.TemplateSyntaxError as exc:
            raise TemplateError(f"{origin}:{exc.lineno}: {exc.message}") from None

    def call(self, macro: str, **kwargs: Any) -> str:
        """Render a macro by name (the project's definition if it has one)."""
        if macro not in self.registry:
            raise TemplateError(f"no macro named {macro} (built-in or in {MACROS_DIR}/)")
        definition = self.registry[macro]
        if not getattr(definition, "catch_kwargs", True):
            # A project macro written for fewer arguments keeps working as the built-in grows.
            declared = set(getattr(definition, "arguments", kwargs))
            kwargs = {k: v for k, v in kwargs.items() if k in declared}
        try:
            return self.namespace[macro](**kwargs).strip()
        except jinja2.TemplateError as exc:
            raise TemplateError(f"{self.origins[macro]}: macro {macro}: {exc}") from None

    def model_path(self, name: TableName) -> Path:
        """Where a table's model override lives: models/<schema>/<table>.sql."""
        return (
            self.project_dir / MODELS_DIR / _path_part(name.schema) / f"{_path_part(name.name)}.sql"
        )

    def model(self, name: TableName, columns: list[str], read_as: str | None = None) -> Model:
        """The table's extraction SELECT: the project's model file, else `default_model`.
        `read_as`: the table's name as the built-in default_model reads it (`ONLY "s"."t"`
        for a table others inherit from, postgres/catalog.TableInfo.has_children); a model
        file or a project's own default_model gets the name, and reads what it says."""
        context = {
            "source": name.sql(),
            "columns": [quote_ident(c) for c in columns],
            "source_schema": name.schema,
            "source_table": name.name,
        }
        path = self.model_path(name)
        if not path.is_file():
            builtin = self.origins["default_model"].startswith("built-in")
            source = (read_as or context["source"]) if builtin else context["source"]
            text = self.call("default_model", source=source, columns=context["columns"])
            origin = f"macro default_model ({self.origins['default_model']})"
            # The built-in macro's text is the tool's own, its names quoted: nothing to check
            # (a thousand tables skip a thousand parses).
            checked = text.strip() if builtin else validate_select(text, origin)
            return Model(checked, origin, True, builtin)
        origin = str(path.relative_to(self.project_dir))
        source = path.read_text(encoding="utf-8")
        self._parse(origin, source)
        try:
            text = self.env.from_string(source, globals=self.namespace).render(context)
        except jinja2.TemplateError as exc:
            line = getattr(exc, "lineno", None)
            raise TemplateError(f"{origin}{f':{line}' if line else ''}: {exc}") from None
        return Model(validate_select(text, origin), origin, False)


def stray_models(templates: Templates, tables: list[TableName]) -> list[tuple[str, str | None]]:
    """Model files no configured table reads (a typo in a file name would silently leave a
    filter, say one that keeps PII out, unapplied): each as `models/...` with the nearest
    file a table does read, if one is close."""
    folder = templates.project_dir / MODELS_DIR
    if not folder.is_dir():
        return []
    wanted = {str(templates.model_path(t).relative_to(templates.project_dir)) for t in tables}
    found = sorted(str(p.relative_to(templates.project_dir)) for p in folder.rglob("*.sql"))
    return [(path, _nearest(path, sorted(wanted))) for path in found if path not in wanted]


def _nearest(path: str, wanted: list[str]) -> str | None:
    """The model file a misspelt one was meant to be: its schema folder and its table's
    name each close to those of a file a table reads (compared apart: a long schema name
    shared by every file of a folder would make any two of them look close)."""

    def close(a: str, b: str) -> float:
        return difflib.SequenceMatcher(None, a, b).ratio()

    here = PurePosixPath(path)
    scored = []
    for model in wanted:
        there = PurePosixPath(model)
        score = close(here.parent.name, there.parent.name) * close(here.stem, there.stem)
        scored.append((score, model))
    best = max(scored, default=(0.0, None))
    return best[1] if best[0] >= 0.75 else None


def _builtin_sources() -> list[tuple[str, str]]:
    folder = resources.files("replicator.project") / "macros"
    return [
        (f"built-in macro {entry.name}", entry.read_text(encoding="utf-8"))
        for entry in sorted(folder.iterdir(), key=lambda e: e.name)
        if entry.name.endswith(".sql")
    ]


def _path_part(identifier: str) -> str:
    escaped = identifier.replace("%", "%25").replace("/", "%2F").replace("\0", "%00")
    return {".": "%2E", "..": "%2E%2E"}.get(escaped, escaped)


def validate_select(text: str, origin: str) -> str:
    """Check rendered SQL is one query; return it up to its last token: without trailing
    semicolons or comments. The engine wraps a model (`SELECT * FROM (<model>) AS ...`), and
    a `--` comment on its last line would swallow the wrapping `)`."""
    import sqlglot  # loaded for a model's SQL only: a table without one never needs it
    from sqlglot import exp

    try:
        tokens = _tokens(text)
        text = text[tokens[0].start : tokens[-1].end + 1] if tokens else ""
        statements = [s for s in sqlglot.parse(text, read="postgres") if s is not None]
    except (sqlglot.errors.ParseError, sqlglot.errors.TokenError) as exc:
        first = exc.errors[0] if isinstance(exc, sqlglot.errors.ParseError) and exc.errors else {}
        where = f":{first.get('line')}:{first.get('col')}" if first.get("line") else ""
        detail = _readable(first.get("description", str(exc)), not first.get("end_context"))
        near = f" at {first['highlight']!r}" if first.get("highlight") else ""
        raise TemplateError(
            f"{origin}{where}: SQL syntax error{near} (line:col of the rendered SQL): {detail}"
        ) from None
    if len(statements) != 1 or not isinstance(statements[0], exp.Query):
        raise TemplateError(f"{origin}: expected exactly one SELECT statement")
    return text


def _tokens(text: str) -> list[Token]:
    """The SQL's tokens (comments are not tokens), without trailing semicolons."""
    import sqlglot
    from sqlglot.tokens import TokenType

    tokens = sqlglot.tokenize(text, read="postgres")
    while tokens and tokens[-1].token_type == TokenType.SEMICOLON:
        tokens.pop()
    return tokens


@functools.cache
def _verbatim() -> frozenset[TokenType]:
    """Tokens whose text is the user's data or a quoted name: kept as written. Unquoted names
    fold to lower case, as PostgreSQL folds them; keywords and operators compare in upper
    case."""
    from sqlglot.tokens import TokenType

    return frozenset(
        (
            TokenType.STRING,
            TokenType.HEREDOC_STRING,
            TokenType.NATIONAL_STRING,
            TokenType.BIT_STRING,
            TokenType.HEX_STRING,
            TokenType.BYTE_STRING,
            TokenType.RAW_STRING,
            TokenType.IDENTIFIER,
            TokenType.NUMBER,
        )
    )


# A quoted name that PostgreSQL would fold to itself unquoted (keywords stay apart: they
# compare in upper case).
_PLAIN_NAME = re.compile(r"[a-z_][a-z0-9_$]*")


def canonical_sql(text: str) -> str:
    """A model's SQL with what does not change its meaning taken out: whitespace, comments,
    trailing semicolons, the case of keywords and of unquoted names. Two models with the
    same canonical form read the same rows (`plan/signature.py` keeps its hash)."""
    from sqlglot.tokens import TokenType

    verbatim, parts = _verbatim(), []
    for token in _tokens(text):
        kind = token.token_type
        if kind == TokenType.IDENTIFIER and _PLAIN_NAME.fullmatch(token.text):
            parts.append(token.text)  # `"status"` is `status`
        elif kind in verbatim:
            parts.append(f"{kind.name}:{token.text}")
        elif kind == TokenType.VAR:
            parts.append(token.text.lower())
        else:
            parts.append(token.text.upper())
    return " ".join(parts)


def _readable(description: str, at_end: bool) -> str:
    """The parser's description without its internals (`<Token ...>`, `for <class ...>`).
    `Required keyword: 'this' missing` names an argument of sqlglot's expression classes,
    which means nothing to a user: it says an expression is missing there, or, at the end of
    the text, that the statement ends early (`... AND (`)."""
    text = re.sub(r"\s*for <class '[^']*'>", "", description.split("<Token")[0]).strip()
    if expecting := re.fullmatch(r"Expecting (\S+)", text):
        return f"expected {expecting[1]!r} here"
    if not re.fullmatch(r"Required keyword: '\w+' missing", text):
        return text
    if at_end:
        return "the statement ends early: an expression is missing at its end"
    return "an expression is missing here"
