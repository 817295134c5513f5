"""A project directory: its config, environment, templates and sync-state, loaded once."""

from __future__ import annotations

import difflib
import shlex
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

from ..base.errors import ConfigError
from ..base.identifiers import TableName, split_name
from ..base.name_patterns import NamePattern, is_pattern
from .cdc_state import CaptureState, read_capture_state, rejoin_mark, resolve_names
from .config import CONFIG_FILE, ProjectConfig, TableConfig, load_config
from .identity import PROJECT_SETTING, ensure_identity, read_identity
from .settings import DEST_URL, Connections, Environment, Settings, with_setting
from .state import STATE_DIR, StateStore, TableState
from .templates import Templates


@dataclass(frozen=True)
class Vanished:
    """A table a pattern chose at an earlier run that the source no longer has."""

    name: TableName
    entry: int
    pattern: str
    state_file: Path

    def line(self) -> str:
        return (
            f"{self.name} matched tables[{self.entry}] ({self.pattern}) at an earlier run and "
            "is gone from the source: its copy is kept, and so is its sync-state "
            f"({self.state_file}) until `replicator state reset {shlex.quote(str(self.name))}` "
            "removes it"
        )


@dataclass(frozen=True)
class Project:
    root: Path
    config: ProjectConfig
    env: Environment
    # Set by plan/selection.py once the pattern entries of `config.tables` are replaced by
    # the tables they match: every command works on the expanded list.
    expanded: bool = False
    vanished: tuple[Vanished, ...] = ()
    unmatched: tuple[str, ...] = ()  # a line for each pattern that matched no table
    # ...and, when one did, the tables sync-state has copied that no entry selects now: a
    # pattern written wrong (`orders` as `order`) leaves them behind, which is an error
    abandoned: tuple[TableName, ...] = ()

    @classmethod
    def load(cls, root: Path) -> Project:
        """Validate the config and read the environment; ConfigError (exit 2) when invalid."""
        root = root.resolve()
        env = Environment.load(root)
        return cls(root, load_config(root), env)

    @property
    def state_dir(self) -> Path:
        return self.root / STATE_DIR

    @cached_property
    def cdc_tables(self) -> frozenset[TableName]:
        """The source tables of the config's `cdc` tables, once per (expanded) project: a
        partition of one of them cannot be captured too (cdc/preflight.py)."""
        return frozenset(t.name for t in self.config.tables if t.mode == "cdc")

    @cached_property
    def store(self) -> StateStore:
        return StateStore(self.state_dir)

    @cached_property
    def templates(self) -> Templates:
        return Templates(self.root)

    @cached_property
    def settings(self) -> Settings:
        """Spark, webhook and output settings, resolved once (ConfigError when invalid)."""
        return Settings.resolve(self.config, self.env, self.root)

    def current_settings(self) -> Settings:
        """The settings again, for each run of `sync --follow`: whether the warm Spark
        server is up (and fit) changes while it follows."""
        return Settings.resolve(self.config, self.env, self.root)

    def connections(self) -> Connections:
        return Connections.from_environment(self.env, read_identity(self.state_dir))

    def optional_destination(self) -> str | None:
        """The destination's connection string as `connections` gives it (with the project's
        identity), or None when it is not set (`status` and `compile` go on without it)."""
        url = self.env.optional_connection(DEST_URL)
        return (
            None
            if url is None
            else with_setting(url, PROJECT_SETTING, read_identity(self.state_dir))
        )

    def claim_identity(self) -> str:
        """The project's identity, made now on its first sync (project/identity.py)."""
        return ensure_identity(self.state_dir)

    def planning_state(self, table: TableConfig) -> TableState | None:
        """The table's state as its next sync plans from it: a `cdc` table back in the
        config since the slot was last read carries the reload mark that sync writes first
        (`status` and `compile` show the same plan). StateError when a file is unusable."""
        state = self.store.read(table.name)
        if table.mode != "cdc":
            return state
        return rejoin_mark(read_capture_state(self.state_dir), table, state) or state

    def capture_names(self) -> CaptureState | None:
        """The slot and publication the `cdc` tables use, for commands that only look
        (`check`, `status`): the stored ones, or the config's when it names them (a DBA's
        slot exists before the first sync); None before the first sync of a project that
        names none (the sync picks them). StateError when cdc.json cannot be trusted."""
        stored = read_capture_state(self.state_dir)
        configured = self.config.cdc
        if stored is None and (configured is None or configured.slot is None):
            return None
        return resolve_names(configured, stored)

    def find(self, text: str) -> TableConfig:
        """The configured table a user named on the command line (schema optional if
        unique); ConfigError (exit 2) when none or several are."""
        return find_table(self.config.tables, text)

    def select(self, names: tuple[str, ...]) -> tuple[TableConfig, ...]:
        """The tables named on the command line in config order; all of them when none. A
        name may be a pattern (`tenant_*.orders`, as in tables-config.json): every table the
        config selects that it matches."""
        if not names:
            return self.config.tables
        chosen: set[TableName | NamePattern] = set()
        for text in names:
            if is_pattern(text):
                chosen |= {t.name for t in match_tables(self.config.tables, text)}
            else:
                chosen.add(self.find(text).name)
        return tuple(t for t in self.config.tables if t.name in chosen)


def match_tables(tables: tuple[TableConfig, ...], text: str) -> list[TableConfig]:
    """The configured tables a pattern named on the command line matches; exit 2 when it is
    no pattern or matches none."""
    try:
        pattern = NamePattern.parse(text)
    except ValueError as exc:
        raise ConfigError([f"{text}: {exc}"]) from None
    found = [t for t in tables if isinstance(t.name, TableName) and pattern.matches(t.name)]
    if not found:
        raise ConfigError(
            [f"{text} matches no table of {CONFIG_FILE} (`replicator ls` lists them)"]
        )
    return found


def find_table(tables: tuple[TableConfig, ...], text: str) -> TableConfig:
    """Resolve a table named on the command line; exit 2 if it is not configured."""
    try:
        parts = split_name(text.strip())
    except ValueError as exc:
        raise ConfigError([f"{text}: {exc}"]) from None
    if len(parts) == 2:
        matches = [t for t in tables if t.name == TableName(*parts)]
    elif len(parts) == 1:
        matches = [t for t in tables if t.name.name == parts[0]]
    else:
        matches = []
    if len(matches) == 1:
        return matches[0]
    known = [str(t.name) for t in tables]
    if len(matches) > 1:
        hint = "it is ambiguous; qualify it with its schema"
    else:
        close = difflib.get_close_matches(text, known, n=1)
        hint = f"did you mean {close[0]}?" if close else f"configured: {', '.join(known)}"
    raise ConfigError([f"table {text} is not in {CONFIG_FILE}: {hint}"])
