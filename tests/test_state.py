"""sync-state files: atomic replacement, strict reading, names safe for any identifier."""

from __future__ import annotations

import errno
import json
import os
import resource
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from dbcompare import assert_same_table
from psycopg import sql

from replicator.base.errors import StateError
from replicator.base.identifiers import TableName
from replicator.project.state import Cursor, RunOutcome, StateStore, TableState, state_file_stem

ORDERS = TableName("public", "orders")


def _state(cursor: str = "2026-11-20 10:00:00.123456+00") -> TableState:
    return TableState(
        table=str(ORDERS),
        cursor=Cursor(value=cursor, type="timestamp with time zone"),
        schema_signature={"columns": [["id", "bigint", True]]},
        last_synced_at="2026-11-20T10:00:05Z",
        last_run=RunOutcome(
            run_id="r1",
            started_at="a",
            finished_at="b",
            status="success",
            action="incremental",
            rows=3,
            reason="cursor x",
        ),
    )


def test_roundtrip_keeps_cursor_text_exactly(tmp_path):
    store = StateStore(tmp_path)
    path = store.write(_state(), ORDERS)
    assert path == tmp_path / "public.orders.json"
    loaded = store.read(ORDERS)
    assert loaded == _state()
    document = json.loads(path.read_text())
    assert document["format_version"] == 1
    assert document["cursor"] == {
        "value": "2026-11-20 10:00:00.123456+00",
        "type": "timestamp with time zone",
    }


def test_missing_state_is_none_and_reset_deletes(tmp_path):
    store = StateStore(tmp_path)
    assert store.read(ORDERS) is None
    store.write(_state(), ORDERS)
    assert store.delete(ORDERS) is True
    assert store.read(ORDERS) is None
    assert store.delete(ORDERS) is False


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        pytest.param(b"", "corrupt or truncated", id="empty"),
        pytest.param(None, "corrupt or truncated", id="truncated"),
        pytest.param(b"\xff\xfe\x00garbage", "corrupt or truncated", id="random-bytes"),
        pytest.param(b"[]", "not a JSON object", id="not-object"),
        pytest.param(b'{"table": "public.orders"}', "no format_version", id="no-version"),
        pytest.param(
            b'{"format_version": 99, "table": "public.orders"}',
            "written by a newer replicator (state format 99",
            id="future",
        ),
        pytest.param(
            b'{"format_version": 1, "table": "public.orders", "cursor": 5}',
            "corrupt sync-state file (cursor",
            id="wrong-type",
        ),
        pytest.param(
            b'{"format_version": 1, "table": "public.other"}',
            "holds the state of public.other",
            id="other-table",
        ),
    ],
)
def test_untrustworthy_files_are_errors_naming_file_and_fix(tmp_path, content, expected):
    store = StateStore(tmp_path)
    path = store.write(_state(), ORDERS)
    if content is None:
        content = path.read_bytes()[:40]
    path.write_bytes(content)
    with pytest.raises(StateError) as info:
        store.read(ORDERS)
    message = str(info.value)
    assert str(path) in message
    assert expected in message
    assert "replicator state reset public.orders" in message
    assert path.read_bytes() == content, "reading must never rewrite or reset the file"


@pytest.mark.parametrize(
    ("name", "stem"),
    [
        (TableName("public", "orders"), "public.orders"),
        (TableName("public", "Orders"), "public.%4Frders"),
        (TableName("a.b", "c/d"), "a%2Eb.c%2Fd"),
        (TableName("..", "ü"), "%2E%2E.%C3%BC"),
    ],
)
def test_file_names_are_safe_and_distinct(name, stem):
    assert state_file_stem(name) == stem


def test_hostile_names_get_distinct_files_on_disk(tmp_path):
    store = StateStore(tmp_path)
    names = [
        TableName("public", "orders"),
        TableName("public", "Orders"),
        TableName("public", "ORDERS"),
        TableName("pub.lic", "orders"),
        TableName("public", ".orders"),
        TableName("😀" * 15, "é" * 31),
        TableName("😀" * 15, "é" * 30 + "e"),
    ]
    for name in names:
        store.write(TableState(table=str(name)), name)
    files = sorted(p.name for p in tmp_path.iterdir())
    assert len(files) == len(names)
    assert all(len(f.encode()) <= 255 and "/" not in f and not f.startswith(".") for f in files)
    assert len({f.lower() for f in files}) == len(files), "case-insensitive file systems merge"
    for name in names:
        assert store.read(name).table == str(name)


_KILLED_WRITER = """
import sys
from pathlib import Path
from replicator.base.identifiers import TableName
from replicator.project.state import StateStore, TableState, Cursor
store = StateStore(Path(sys.argv[1]))
store.write(TableState(table="public.orders", cursor=Cursor(value="NEW", type="text"),
                       last_synced_at="x"), TableName("public", "orders"))
"""


def test_write_killed_between_temp_file_and_rename_keeps_old_state(tmp_path):
    store = StateStore(tmp_path)
    store.write(_state(), ORDERS)
    env = {**os.environ, "REPLICATOR_FAILPOINT": "state-before-rename"}
    proc = subprocess.run([sys.executable, "-c", _KILLED_WRITER, str(tmp_path)], env=env)
    assert proc.returncode == -9
    leftovers = [p.name for p in tmp_path.iterdir() if p.name.startswith(".")]
    assert leftovers, "the temp file of the killed write is on disk"
    assert store.read(ORDERS) == _state()
    # The next write succeeds and sweeps the leftover temp file.
    subprocess.run([sys.executable, "-c", _KILLED_WRITER, str(tmp_path)], check=True)
    assert store.read(ORDERS).cursor.value == "NEW"
    assert [p.name for p in tmp_path.iterdir()] == ["public.orders.json"]


def test_state_folder_is_portable(tmp_path):
    """Copying the folder elsewhere is the supported way to move a pipeline."""
    store = StateStore(tmp_path / "a")
    store.write(_state(), ORDERS)
    moved = tmp_path / "b"
    (tmp_path / "a").rename(moved)
    assert StateStore(moved).read(ORDERS) == _state()
    assert not any(str(tmp_path / "a") in p.read_text() for p in Path(moved).iterdir())


class _FullDisk:
    """The project's sync-state folder on a 256 KiB tmpfs that `fill` fills up (root may
    mount one). Where mount is refused, a file size limit on the sync's process instead:
    its state write then fails with EFBIG rather than ENOSPC."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        mounted = os.geteuid() == 0 and (
            subprocess.run(
                ["mount", "-t", "tmpfs", "-o", "size=256k,mode=0755", "tmpfs", str(folder)],
                capture_output=True,
            ).returncode
            == 0
        )
        self.mounted = mounted
        self.cause = "No space left on device" if mounted else "File too large"
        self.full = False

    def fill(self) -> None:
        self.full = True
        if not self.mounted:
            return
        with open(self.folder / "filler", "wb", buffering=0) as handle:
            try:
                while True:
                    handle.write(b"x" * 4096)
            except OSError as exc:
                assert exc.errno == errno.ENOSPC, exc

    def free(self) -> None:
        self.full = False
        (self.folder / "filler").unlink(missing_ok=True)

    def limit(self) -> None:
        """preexec_fn of the sync's process: the fallback's limit while the disk is 'full'."""
        if self.full and not self.mounted:
            signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # EFBIG instead of a kill
            resource.setrlimit(resource.RLIMIT_FSIZE, (64, 64))

    def close(self) -> None:
        if self.mounted:
            subprocess.run(["umount", str(self.folder)], check=True)


def _sync_process(project, disk: _FullDisk) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "replicator", "sync", "--project-dir", str(project.path)],
        env={**os.environ, **project.env},
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
        preexec_fn=disk.limit,
        timeout=300,
    )


def test_a_full_disk_names_the_state_file_and_the_next_run_converges(
    db_project, source_conn, dest_conn, schema, monkeypatch
):
    """The state write after a merge fails for want of space: the sync says which file and
    why, removes its temporary file, leaves the old state as it was and keeps the merged
    rows; once there is room, the next run converges."""
    monkeypatch.setenv("REPLICATOR_SPARK_MIN_ROWS", "1000000")  # no JVM under the limit
    table = sql.Identifier(schema, "orders")
    source_conn.execute(
        sql.SQL(
            "CREATE TABLE {} (id int PRIMARY KEY, updated_at timestamptz NOT NULL DEFAULT now())"
        ).format(table)
    )
    source_conn.execute(sql.SQL("INSERT INTO {} SELECT generate_series(1, 100)").format(table))
    db_project.write_config(
        {"tables": [{"name": f"{schema}.orders", "replication_key": "updated_at"}]}
    )
    folder = db_project.path / "sync-state"
    disk = _FullDisk(folder)
    try:
        assert _sync_process(db_project, disk).returncode == 0
        state_file = StateStore(folder).path_for(TableName(schema, "orders"))
        before = state_file.read_bytes()
        source_conn.execute(
            sql.SQL(
                "INSERT INTO {} SELECT g, now() + interval '1 min' FROM generate_series(101, 150) g"
            ).format(table)
        )
        disk.fill()
        failed = _sync_process(db_project, disk)
        assert failed.returncode == 1, failed.stderr
        assert f"{state_file}: cannot write sync-state: {disk.cause}" in failed.stderr
        assert "then run again" in failed.stderr
        assert "internal error" not in failed.stderr and "Traceback" not in failed.stderr
        assert failed.stderr.count("cannot write sync-state") == 1, failed.stderr
        assert not [p.name for p in folder.iterdir() if ".tmp-" in p.name]
        assert state_file.read_bytes() == before, "the old state is untouched"
        (rows,) = dest_conn.execute(sql.SQL("SELECT count(*) FROM {}").format(table)).fetchone()
        assert rows == 150, "the merge committed before the state write stays"
        disk.free()
        again = _sync_process(db_project, disk)
        assert again.returncode == 0, again.stderr
        assert assert_same_table(source_conn, dest_conn, schema, "orders") == 150
        assert StateStore(folder).read(TableName(schema, "orders")).last_run.status == "success"
    finally:
        disk.close()
