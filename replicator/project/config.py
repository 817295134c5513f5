"""tables-config.json: parsed and validated into frozen objects, or one error per problem.

Every problem names the file, the JSON path (`tables[1].replication_key`), what was expected
and, for a misspelt key or value, the nearest valid one. Keys starting with `//` are comments.
"""

from __future__ import annotations

import difflib
import json
from pathlib import Path
from typing import Annotated, Any, Literal, get_args

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    model_validator,
)

from ..base.errors import ConfigError
from ..base.identifiers import TableName
from ..base.name_patterns import NamePattern
from .cdc_config import CdcConfig
from .config_rules import HISTORY_SUFFIX, rule_problems
from .config_values import (
    column,
    http_url,
    not_empty,
    spark_keys,
    table_name,
    table_or_pattern,
    where_expression,
)
from .freshness_config import FreshnessConfig
from .metrics_config import MetricsConfig
from .spark_remote import checked_url

CONFIG_FILE = "tables-config.json"
MODES = ("incremental-deduped", "incremental-append", "full-refresh", "cdc")
Mode = Literal["incremental-deduped", "incremental-append", "full-refresh", "cdc"]
# What a table whose source schema changed does: reload alone (default), fail alone, or take
# the change in place where it can (plan/evolution.py), reloading where it cannot.
SchemaPolicy = Literal["full_reload", "fail", "evolve"]
# "skip": the first sync copies no existing row; it starts at the source's newest key.
InitialLoad = Literal["full", "skip"]
# What a cursor table does with rows deleted in the source.
Deletes = Literal["ignore", "delete", "mark"]


def _some_tables(tables: tuple[TableConfig, ...]) -> tuple[TableConfig, ...]:
    if not tables:
        raise ValueError("expected at least one table")
    return tables


TableNameField = Annotated[TableName, BeforeValidator(table_name)]
# A table's name or a pattern of names (`sales.*`): plan/selection.py expands it.
NameOrPattern = Annotated[TableName | NamePattern, BeforeValidator(table_or_pattern)]
ColumnField = Annotated[str, BeforeValidator(column)]
# strict=False: a JSON list becomes the tuple (a string is still refused).
ColumnList = Annotated[tuple[ColumnField, ...], Field(strict=False), AfterValidator(not_empty)]


class _Frozen(BaseModel):
    model_config = ConfigDict(
        extra="forbid", frozen=True, strict=True, arbitrary_types_allowed=True
    )


class ColumnsConfig(_Frozen):
    """Columns shaped on their way out of the source (plan/shaping.py)."""

    # strict=False: a JSON list becomes the tuple (a string is still refused).
    exclude: Annotated[tuple[ColumnField, ...], Field(strict=False)] = ()
    hash: Annotated[tuple[ColumnField, ...], Field(strict=False)] = ()
    # The only columns that leave the source (with the hashed ones): a column the source
    # gains later stays there. Not with `exclude`.
    include: ColumnList | None = None  # given, never empty: [] would let every column out


# PostgreSQL's index methods (pg_am) a `tables[].indexes` entry may name.
IndexType = Literal["btree", "hash", "gist", "gin", "brin", "spgist"]


class IndexConfig(_Frozen):
    """An index the copy keeps, in dbt-postgres's shape (postgres/copy_objects.py)."""

    columns: ColumnList
    unique: bool = False
    type: IndexType = "btree"


class HistoryConfig(_Frozen):
    """`"history": {"table": "schema.name"}`: where a table's versions are kept
    (postgres/history_tables.py)."""

    table: TableNameField | None = None  # None: the copy's name with HISTORY_SUFFIX


def _history_value(value: Any) -> Any:
    """`true` keeps history in the default table, `false` none, an object names the table."""
    if value is True:
        return {}
    if value is False or value is None:
        return None
    if isinstance(value, dict):
        return value
    raise ValueError('expected true, false or {"table": "schema.name"}')


class TableConfig(_Frozen):
    """One replicated table: where it comes from, where it goes, and how it is kept in sync."""

    name: NameOrPattern
    replication_key: ColumnField | None = None
    mode: Mode | None = None
    # strict=False: a JSON list becomes the tuple (a string is still refused).
    primary_key: ColumnList | None = None
    destination: NameOrPattern | None = None
    # For a pattern name: the tables it must not match (patterns or names).
    exclude: Annotated[tuple[NameOrPattern, ...], Field(strict=False)] = ()
    partitions: Annotated[int, Field(ge=1, le=10_000)] | None = None
    columns: ColumnsConfig | None = None
    where: Annotated[str, AfterValidator(where_expression)] | None = None
    lookback: Annotated[int, Field(ge=0, le=86_400)] = 5
    # None: the top-level `on_schema_change` (resolved when the project config is read).
    on_schema_change: SchemaPolicy | None = None
    initial_load: InitialLoad = "full"
    deletes: Deletes = "ignore"
    deletes_interval: Annotated[int, Field(ge=0, le=31_536_000)] = 0  # seconds; 0: every sync
    indexes: Annotated[tuple[IndexConfig, ...], Field(strict=False)] = ()
    # None: the top-level `freshness` (resolved when the project config is read); dbt-sources
    freshness: FreshnessConfig | None = None
    # every version of each row, from the log or from what each sync read (true: the
    # destination's name with HISTORY_SUFFIX, beside it)
    history: Annotated[HistoryConfig | None, BeforeValidator(_history_value)] = None
    # The name exactly as written in the config: the webhook and logs use it.
    written_name: str = Field(default="", exclude=True)
    # Set on the tables a pattern entry expands to (plan/selection.py): the index of the
    # entry in `tables`, its pattern as written, and a problem that fails the table alone.
    entry: int = Field(default=0, exclude=True)
    pattern: str | None = Field(default=None, exclude=True)
    problem: str | None = Field(default=None, exclude=True)

    @model_validator(mode="after")
    def _defaults(self) -> TableConfig:
        """The defaults that depend on other keys. The rules between keys are checked on the
        document as written (config_rules.py), so that they run whatever else failed."""
        if self.mode is None:
            object.__setattr__(self, "mode", "incremental-deduped")
        if self.destination is None:
            object.__setattr__(self, "destination", self.name)
        return self

    def pattern_fix(self) -> str:
        """For a problem of a table a pattern chose: how to take it out of the pattern."""
        if self.pattern is None:
            return ""
        return (
            f"; or leave the table out of tables[{self.entry}] ({self.pattern}): add "
            f"{json.dumps(self.written_name, ensure_ascii=False)} to its "
            '"exclude" (as JSON writes it), or give it an entry of its own'
        )

    @property
    def history_table(self) -> TableName | None:
        """Where the copy's versions are kept; None: the table keeps no history."""
        if self.history is None:
            return None
        if self.history.table is not None:
            return self.history.table
        target = self.target
        return TableName(target.schema, target.name + HISTORY_SUFFIX)

    @property
    def is_pattern(self) -> bool:
        """Whether this entry names a pattern of tables (expanded at every run)."""
        return isinstance(self.name, NamePattern)

    @property
    def source(self) -> TableName:
        """The source table (an expanded entry: never a pattern)."""
        assert isinstance(self.name, TableName), "a pattern entry is expanded first"
        return self.name

    @property
    def target(self) -> TableName:
        """The destination table (defaults to the source's name)."""
        assert isinstance(self.destination, TableName), "a pattern entry is expanded first"
        return self.destination


class WebhookConfig(_Frozen):
    url: Annotated[str, AfterValidator(http_url)]
    secret: str | None = None
    # `sync --follow`: successful runs are summed up in one post at most this often
    summary_interval: Annotated[int, Field(ge=1, le=86_400)] = 60


class SparkConfig(_Frozen):
    master: str | None = None
    remote: Annotated[str, AfterValidator(checked_url)] | None = None  # wins over master
    # Batches (and tables) estimated below this many rows are copied by the replicator
    # process itself, with the same COPY streaming: no JVM start for a small batch. Unset:
    # chosen from what this host measured (spark/engine_choice.py).
    min_rows: Annotated[int, Field(ge=0)] | None = None
    conf: Annotated[dict[str, str], AfterValidator(spark_keys)] = Field(default_factory=dict)
    # Ship replicator and its dependencies to a cluster's executors or a Connect server
    ship_environment: bool = True


class ProjectConfig(_Frozen):
    """The whole tables-config.json."""

    tables: Annotated[tuple[TableConfig, ...], Field(strict=False), AfterValidator(_some_tables)]
    webhook: WebhookConfig | None = None
    spark: SparkConfig = Field(default_factory=SparkConfig)
    on_schema_change: SchemaPolicy = "full_reload"
    cdc: CdcConfig | None = None
    # days of `_replicator.runs` kept in the destination (report/history.py)
    history_days: Annotated[int, Field(ge=1, le=36_500)] = 90
    metrics: MetricsConfig | None = None
    freshness: FreshnessConfig | None = None  # the tables' default

    @model_validator(mode="after")
    def _inherit_defaults(self) -> ProjectConfig:
        for table in self.tables:
            if table.on_schema_change is None:
                object.__setattr__(table, "on_schema_change", self.on_schema_change)
            # an explicit `"freshness": null` keeps the table out of the default
            if table.freshness is None and "freshness" not in table.model_fields_set:
                object.__setattr__(table, "freshness", self.freshness)
        return self


# ---------------------------------------------------------------- loading and errors

_MODELS: dict[str, type[BaseModel]] = {
    "": ProjectConfig,
    "tables": TableConfig,
    "webhook": WebhookConfig,
    "spark": SparkConfig,
    "cdc": CdcConfig,
    "columns": ColumnsConfig,
    "indexes": IndexConfig,
    "metrics": MetricsConfig,
    "freshness": FreshnessConfig,
    "history": HistoryConfig,
}


def load_config(project_dir: Path) -> ProjectConfig:
    """Read and validate `<project>/tables-config.json`; raise ConfigError listing problems."""
    path = project_dir / CONFIG_FILE
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(
            [
                f"{path}: not found; create a project with `replicator init DIR` "
                "or pass --project-dir"
            ]
        ) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError([f"{path}: cannot read: {exc}"]) from None
    return parse_config(text, str(path))


def parse_config(text: str, filename: str = CONFIG_FILE) -> ProjectConfig:
    """Validate the JSON text of a config file; `filename` prefixes every error."""
    duplicates: list[tuple[dict[str, Any], list[str]]] = []
    try:
        document = json.loads(text, object_pairs_hook=lambda pairs: _keyed(pairs, duplicates))
    except json.JSONDecodeError as exc:
        before, after = text[: exc.pos].rstrip(), text[exc.pos :].lstrip()[:1]
        hint = ""
        if before.endswith(",") and after in ("}", "]"):
            hint = " (a comma before a closing } or ] is not JSON)"
        elif after in ("{", "[") and exc.msg.startswith("Expecting property name"):
            hint = " (is a } or ] missing before it?)"
        elif text[exc.pos : exc.pos + 2] in ("//", "/*"):
            hint = ' (JSON has no comments: write one as a key, `"//": "your note"`)'
        raise ConfigError(
            [f"{filename}:{exc.lineno}:{exc.colno}: invalid JSON: {exc.msg}{hint}"]
        ) from None
    # every object's, each key once; the rest of the file is checked all the same, with the
    # value JSON keeps (the last)
    doubled = [
        f"{filename}: {json_path(_path_of(document, holder))}: "
        f"{'keys' if len(keys) > 1 else 'key'} {', '.join(map(_quoted, keys))} given more than "
        "once: JSON keeps only the last value of each; give each once"
        for holder, keys in duplicates
    ]
    document = _strip_comments(document)
    if not isinstance(document, dict):
        raise ConfigError([f'{filename}: expected a JSON object like {{"tables": [...]}}'])
    written = _written_names(document)
    try:
        config: ProjectConfig | None = ProjectConfig.model_validate(document)
        errors: list[Any] = []
    except ValidationError as exc:
        config, errors = None, exc.errors()
    problems = [*doubled, *(_describe(err, filename) for err in errors)]
    problems += [f"{filename}: {p}" for p in rule_problems(document, _unsure_keys(errors))]
    if problems or config is None:
        raise ConfigError(problems)
    for index, (table, name) in enumerate(zip(config.tables, written, strict=True)):
        object.__setattr__(table, "written_name", name)
        object.__setattr__(table, "entry", index)
    return config


def _keyed(
    pairs: list[tuple[str, Any]], duplicates: list[tuple[dict[str, Any], list[str]]]
) -> dict[str, Any]:
    """An object of the config; its keys given more than once go into `duplicates`, with
    the object itself (its place in the document is found once it is whole: _path_of)."""
    result: dict[str, Any] = {}
    again: list[str] = []
    for key, value in pairs:
        if key in result and key not in again:
            again.append(key)
        result[key] = value
    if again:
        duplicates.append((result, again))
    return result


def _quoted(key: str) -> str:
    return json.dumps(key, ensure_ascii=False)


def _path_of(document: Any, wanted: dict[str, Any], here: tuple[int | str, ...] = ()) -> tuple:
    """Where the object `wanted` (that very one) stands in the parsed document."""
    if document is wanted:
        return here
    children = (
        document.items()
        if isinstance(document, dict)
        else enumerate(document)
        if isinstance(document, list)
        else ()
    )
    for key, value in children:
        if isinstance(value, dict | list) and (found := _path_of(value, wanted, (*here, key))):
            return found
    return ()


def _strip_comments(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _strip_comments(v) for k, v in value.items() if not k.startswith("//")}
    if isinstance(value, list):
        return [_strip_comments(v) for v in value]
    return value


def _written_names(document: dict[str, Any]) -> list[str]:
    tables = document.get("tables")
    if not isinstance(tables, list):
        return []
    return [t.get("name") if isinstance(t, dict) else "" for t in tables]


def json_path(loc: tuple[int | str, ...]) -> str:
    """`('tables', 1, 'mode')` -> `tables[1].mode`."""
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "(top level)"


def _describe(err: dict[str, Any], filename: str) -> str:
    loc = tuple(p for p in err["loc"] if p not in ("function-after[http_url(), str]",))
    loc = _drop_validator_frames(loc)
    path = json_path(loc)
    kind, value = err["type"], err.get("input")
    if kind == "extra_forbidden":
        key = str(loc[-1])
        allowed = _allowed_keys(loc[:-1])
        close = _nearest(key, allowed)
        hint = f'did you mean "{close[0]}"?' if close else f"expected one of: {', '.join(allowed)}"
        return f"{filename}: {path}: unknown key; {hint}"
    if kind == "missing":
        return f"{filename}: {path}: required key is missing"
    if kind == "literal_error" and loc and loc[-1] in _CHOICES:
        choices = _CHOICES[str(loc[-1])]
        # "incremental" is the start of two modes: offer both, not the nearest spelling. The
        # choices are lower case: "CDC" means "cdc".
        typed = str(value).lower()
        close = [c for c in choices if c.startswith(typed)] or difflib.get_close_matches(
            typed, choices, n=1
        )
        quoted = " or ".join(f'"{c}"' for c in close)
        hint = f"; did you mean {quoted}?" if close else ""
        return (
            f"{filename}: {path}: expected one of {', '.join(choices)}, got {_short(value)}{hint}"
        )
    if kind == "value_error":
        msg = str(err["msg"]).removeprefix("Value error, ")
        whole = isinstance(value, dict | list)  # a whole object or list: the message says
        said = "got " in msg or whole or _short(value) in msg  # the message shows the value
        got = "" if said else f", got {_short(value)}"
        return f"{filename}: {path}: {msg}{got}"
    if kind == "greater_than_equal":  # the bound pydantic checked: 0 for some keys, 1 for others
        return f"{filename}: {path}: expected a number >= {err['ctx']['ge']}, got {_short(value)}"
    expected = _EXPECTED.get(kind, str(err["msg"]))
    return f"{filename}: {path}: {expected}, got {_short(value)}"


_CHOICES: dict[str, tuple[str, ...]] = {
    "mode": MODES,
    "on_schema_change": get_args(SchemaPolicy),
    "initial_load": get_args(InitialLoad),
    "deletes": get_args(Deletes),
    "type": get_args(IndexType),
}
_EXPECTED = {
    "string_type": "expected a string",
    "tuple_type": "expected a list",
    "list_type": "expected a list",
    "dict_type": "expected an object",
    "model_type": "expected an object",
    "model_attributes_type": "expected an object",
    "bool_type": "expected true or false",
    "int_type": "expected a whole number",
    "less_than_equal": "expected a smaller number",
}


def _unsure_keys(errors: list[Any]) -> dict[int, set[str]]:
    """By table index, the keys pydantic refused, and those a misspelt key was probably meant
    to be (its value is not known): the rules between keys leave them out."""
    unsure: dict[int, set[str]] = {}
    for err in errors:
        loc = _drop_validator_frames(tuple(err["loc"]))
        if len(loc) < 3 or loc[0] != "tables" or not isinstance(loc[1], int):
            continue
        key = str(loc[2])
        if err["type"] == "extra_forbidden":
            key = next(iter(_nearest(key, _allowed_keys(loc[:2]))), key)
        unsure.setdefault(loc[1], set()).add(key)
    return unsure


def _nearest(key: str, allowed: list[str]) -> list[str]:
    return difflib.get_close_matches(key, allowed, n=1, cutoff=0.6)


def _drop_validator_frames(loc: tuple[Any, ...]) -> tuple[Any, ...]:
    """pydantic adds frames like 'function-before[...]' to a location; a user never wrote them."""
    return tuple(p for p in loc if not (isinstance(p, str) and "[" in p and "(" in p))


def _allowed_keys(parent: tuple[Any, ...]) -> list[str]:
    named = [p for p in parent if isinstance(p, str)]
    model = _MODELS.get(named[-1] if named else "", ProjectConfig)
    return [name for name, f in model.model_fields.items() if not f.exclude]


def _short(value: Any) -> str:
    text = json.dumps(value, ensure_ascii=False, default=str)
    return text if len(text) <= 60 else text[:57] + "..."
