"""sync-state: one JSON file per table, written atomically, read strictly.

The folder is the pipeline's memory and is portable: copy it to another host and the next run
continues incrementally. A file that cannot be trusted is an error naming it, never a silent
reset (a reset would mean a full reload the user did not ask for).
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, ValidationError

from ..base.errors import StateError, StateWriteError
from ..base.failpoints import failpoint
from ..base.identifiers import TableName

FORMAT_VERSION = 1
STATE_DIR = "sync-state"
_SAFE = frozenset("abcdefghijklmnopqrstuvwxyz0123456789_-")
_MAX_STEM = 200


class _Record(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


# The cursor type of a `cdc` table: its copy's position in the source's log.
LSN_CURSOR_TYPE = "pg_lsn"


class Cursor(_Record):
    """A replication-key value exactly as PostgreSQL printed it, with its type (for a `cdc`
    table, LSN_CURSOR_TYPE)."""

    value: str
    type: str


class Pending(_Record):
    """A cursor not yet safe: source transactions were open when it was read.

    It becomes the cursor once all of them have ended: until then one of them could still
    commit a row with a key below it. They are every transaction with an xid below `before`
    (the next xid then, as xid8 text) and the `sessions` open then (virtual transaction
    ids, which also name those that had not written yet): postgres/open_transactions.py."""

    value: str
    before: str
    sessions: list[str] = []
    # when the cursor began waiting for these transactions (they, or some of them, were
    # already open at the reads before), and the pids of the sessions they are: what
    # `status` and the sync's log name when one is held open for long
    since: str | None = None
    pids: list[int] = []


class Window(_Record):
    """Fingerprint of the rows at or past the cursor when they were last read: if the
    source still gives the same one, nothing changed and the run is a no-op."""

    rows: int
    hash: str
    max: str | None = None


class RunOutcome(_Record):
    """What the last sync did to this table."""

    run_id: str
    started_at: str
    finished_at: str
    status: Literal["success", "failure"]
    action: str | None = None
    rows: int | None = None
    reason: str | None = None
    error: str | None = None
    # a table that keeps history (tables[].history): the versions the run began and ended
    versions_added: int | None = None
    versions_closed: int | None = None


class TableState(_Record):
    """Everything the next run needs to continue this table incrementally."""

    format_version: int = FORMAT_VERSION
    table: str
    cursor: Cursor | None = None
    pending: Pending | None = None
    window: Window | None = None
    schema_signature: dict[str, Any] | None = None
    pending_full_reload: bool = False
    pending_reason: str | None = None
    last_synced_at: str | None = None
    last_run: RunOutcome | None = None
    deletes_checked_at: str | None = None  # the last delete check (`deletes_interval`)
    # The destination's xmax (xid8) when the copy was last made exact against the source's
    # keys (its last delete check began, or a load swapped it in): a row only the copy holds
    # whose xmin is older was the source's (deleted there since: the next check removes it);
    # a newer one was written into the copy by someone else (verify: extra).
    exact_xmax: str | None = None
    # Whether the destination table held a row after the last successful sync (None: not
    # recorded yet). A copy that held rows and holds none now was emptied behind the tool's
    # back (a TRUNCATE there): it is reloaded (plan/decide.py).
    holds_rows: bool | None = None
    # The destination table the last successful sync wrote (its OID; None: not recorded
    # yet). Another table there now (the config's destination switched back to an older
    # copy, or another source's load replaced it) is reloaded: the cursor is not its.
    destination_oid: int | None = None
    # the history table the last sync kept the copy's versions in (tables[].history), None
    # when it kept none: one that was not kept through every sync is begun again by a reload
    history_table: str | None = None
    # The rows the last incremental batch read, kept through the no-op runs after it: the
    # size a batch the probe did not count is taken to be (sync/incremental/merge_pipeline.py).
    batch_rows: int | None = None


def state_file_stem(name: TableName) -> str:
    """A file name for any identifier, the same on every OS (case-insensitive ones too).

    Lower-case ASCII letters, digits, `_` and `-` stay; every other byte is `%XX`, so
    `"Orders"` and `orders` never share a file. Over-long names keep a hash of the full name.
    """
    stem = f"{_escape(name.schema)}.{_escape(name.name)}"
    if len(stem) > _MAX_STEM:
        digest = hashlib.sha256(f"{name.schema}\0{name.name}".encode()).hexdigest()[:16]
        stem = f"{stem[: _MAX_STEM - 17]}~{digest}"
    return stem


def _escape(part: str) -> str:
    return "".join(ch if ch in _SAFE else "".join(f"%{b:02X}" for b in ch.encode()) for ch in part)


class StateStore:
    """Reads and writes the sync-state folder of a project."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        # States a run writes at its end, all at once (`write_later`, `flush`).
        self._later: dict[TableName, TableState] = {}
        # While a sync runs (`remember`), the states it wrote: read back without the file
        # (its history and metrics read every table's state at its end, a thousand of them
        # in one project). Off, every read reads the file.
        self._written: dict[TableName, TableState] | None = None

    def path_for(self, name: TableName) -> Path:
        return self.directory / f"{state_file_stem(name)}.json"

    def read(self, name: TableName) -> TableState | None:
        """The table's state, None when it has none; StateError when the file is unusable."""
        if name in self._later:
            return self._later[name]
        if self._written is not None and name in self._written:
            return self._written[name]
        path = self.path_for(name)
        raw = read_state_file(path)
        return None if raw is None else _parse(raw, path, name)

    def write(self, state: TableState, name: TableName) -> Path:
        """Replace the table's state atomically: temp file, fsync, rename, fsync the folder."""
        self._later.pop(name, None)
        if self._written is not None:
            self._written.pop(name, None)
        path = write_atomically(self.directory, self.path_for(name), _text(state))
        if self._written is not None:
            self._written[name] = state
        return path

    def remember(self, on: bool) -> None:
        """Keep the states this process writes from now on, for its reads (`on`), or read
        every file again: a sync remembers for its run alone, since another process may
        write them between two runs of `sync --follow` (`refresh`, `state set-cursor`)."""
        self._written = {} if on else None

    def write_later(self, state: TableState, name: TableName) -> None:
        """Write the state with the others at `flush` (a table a run left as it was: only
        its last run changed). What a crash before then loses is that note alone."""
        self._later[name] = state

    def flush(self) -> None:
        """Write the states held for later, each atomically, with their fsyncs together
        (one disk flush for a thousand untouched tables, not a thousand)."""
        later, self._later = self._later, {}
        if later:
            files = [(self.path_for(name), _text(state)) for name, state in later.items()]
            write_many_atomically(self.directory, files)
            if self._written is not None:
                self._written.update(later)

    def name_in(self, path: Path) -> TableName | None:
        """The table a state file is about (None when it cannot be read: the command that
        reads it as the table's state says why)."""
        try:
            document = json.loads(path.read_bytes())
            return TableName.parse(document["table"])
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def ever_synced(self, path: Path) -> bool:
        """Whether a sync ever copied the table of this state file (a failed first run
        writes one too, to record that run)."""
        try:
            return json.loads(path.read_bytes()).get("last_synced_at") is not None
        except (OSError, ValueError, AttributeError):
            return False

    def delete(self, name: TableName) -> bool:
        """Forget the table's state (its next sync is a full reload); False if it had none."""
        self._later.pop(name, None)
        if self._written is not None:
            self._written.pop(name, None)
        path = self.path_for(name)
        try:
            path.unlink()
        except FileNotFoundError:
            return False
        _fsync_dir(self.directory)
        return True


def read_state_file(path: Path) -> bytes | None:
    """A sync-state file's bytes; None when it does not exist, StateError when unreadable."""
    try:
        return path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise StateError(f"{path}: cannot read sync-state: {exc}") from None


def write_atomically(directory: Path, path: Path, data: str) -> Path:
    """Temp file, fsync, rename, fsync the folder: a crash leaves the old file or the new.

    Any OSError (ENOSPC, EDQUOT, EROFS, EACCES...) is a StateWriteError naming the file and
    the cause, with the temporary file removed and the old file untouched: what the run
    committed in the destination stays, and the next run, finding the old state, redoes the
    rest (a reload is replaced again, a batch merged again idempotently)."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        directory.mkdir(parents=True, exist_ok=True)
        with open(tmp, "w", encoding="utf-8") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        failpoint("state-before-rename")
        os.replace(tmp, path)
    except OSError as exc:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise StateWriteError(
            f"{path}: cannot write sync-state: {exc.strerror or exc}; the previous file is "
            f"unchanged and what this run committed in the destination stays (the next run "
            f"redoes the rest): {_remedy(exc, directory)}, then run again"
        ) from None
    try:
        _fsync_dir(directory)
    except OSError as exc:
        raise StateWriteError(
            f"{path}: sync-state written, but its folder could not be synced to disk: "
            f"{exc.strerror or exc}; check the file system of {directory}"
        ) from None
    for stale in directory.glob(f".{path.name}.tmp-*"):
        with contextlib.suppress(OSError):
            stale.unlink()
    return path


def write_many_atomically(directory: Path, files: list[tuple[Path, str]]) -> None:
    """`write_atomically` for many files: every temp file written, then each fsynced (in
    parallel), then each renamed, then the folder fsynced once. A crash leaves each old file
    or its new one, as one write at a time does.

    Not `syncfs`: it flushes everything the file system holds dirty, the databases' files
    too when they share its disk, which made a no-op run right after a big batch wait on
    their write-back (bench/RESULTS.md), where an fsync of each file waits only for it."""
    written: list[tuple[Path, Path]] = []
    try:
        directory.mkdir(parents=True, exist_ok=True)
        for path, data in files:
            tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
            written.append((tmp, path))
            tmp.write_text(data, encoding="utf-8")
        if len(written) == 1:
            _fsync_file(written[0][0])
        elif written:
            with ThreadPoolExecutor(max_workers=min(32, len(written))) as pool:
                for done in [pool.submit(_fsync_file, tmp) for tmp, _ in written]:
                    done.result()
        for tmp, path in written:
            os.replace(tmp, path)
        _fsync_dir(directory)
    except OSError as exc:
        for tmp, _ in written:
            with contextlib.suppress(OSError):
                tmp.unlink()
        raise StateWriteError(
            f"{directory}: cannot write sync-state: {exc.strerror or exc}; the previous files "
            f"are unchanged (they only missed this run's note of tables it left as they "
            f"were): {_remedy(exc, directory)}, then run again"
        ) from None


def _fsync_file(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _text(state: TableState) -> str:
    return state.model_dump_json(indent=2) + "\n"


def _remedy(exc: OSError, directory: Path) -> str:
    """What a person does about a failed write into `directory`."""
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return f"free space on the file system of {directory}"
    if exc.errno == errno.EFBIG:
        return "raise the file size limit (ulimit -f) of the process that runs replicator"
    if exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        return f"make {directory} writable for the user that runs replicator"
    return f"fix the file system of {directory}"


def _parse(raw: bytes, path: Path, name: TableName) -> TableState:
    fix = (
        f"restore it from a copy, or run `replicator state reset {name}` "
        "(the next sync then reloads the table in full)"
    )
    try:
        document = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise StateError(f"{path}: corrupt or truncated sync-state file ({exc}); {fix}") from None
    if not isinstance(document, dict):
        raise StateError(f"{path}: corrupt sync-state file (not a JSON object); {fix}")
    version = document.get("format_version")
    if not isinstance(version, int) or isinstance(version, bool):
        raise StateError(f"{path}: corrupt sync-state file (no format_version); {fix}")
    if version > FORMAT_VERSION:
        raise StateError(
            f"{path}: written by a newer replicator (state format {version}; this version "
            f"reads format {FORMAT_VERSION}): upgrade replicator, or {fix}"
        )
    try:
        state = TableState.model_validate(document)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise StateError(
            f"{path}: corrupt sync-state file ({where}: {first['msg']}); {fix}"
        ) from None
    if state.table != str(name):
        raise StateError(f"{path}: holds the state of {state.table}, not {name}; {fix}")
    return state


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
