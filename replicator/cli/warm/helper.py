"""The warm helper's process: replicator loaded once, a forked child per command.

`python -m replicator.cli.warm.helper <socket>`, started by `replicator warm start`. It loads
the CLI and the modules the commands use most, then waits on its socket. A run request
(warm_client.py) is answered by `fork()`: the child takes the client's stdin, stdout,
stderr, environment, folder and umask, runs the command as `replicator` would, and sends
its exit code; the helper reaps it and sends its status too (the only word when the child
died by a signal). A client that goes away mid-run (killed) gets its child SIGTERMed, as
the run would have ended with it.

Nothing runs in the helper itself but this loop: no thread, no connection, no command, so
each child starts from the same clean state. Before each fork it compares the package's
files and installed distributions with what it loaded; when they changed it answers
`stale` (the client runs the command itself) and stops.
"""

from __future__ import annotations

import contextlib
import gc
import importlib
import io
import os
import resource
import selectors
import signal
import socket
import sys
import time
import traceback
from itertools import chain
from typing import Any

from .wire import PACKAGE_DIR, RELAYED, connect, installation, receive_request, send_line

# Beside what `replicator` loads for its most-run commands (cli/entry.py): the log drain's,
# which a cdc table's `sync` loads only once it drains, and its row blocks (numpy).
DRAIN_MODULES = ("replicator.sync.cdc.cdc_run", "replicator.cdc.rows.binary_block")
READ_SECONDS = 5.0  # a client sends its request at once; a stuck one must not stall others


def fingerprint() -> list[Any]:
    """What the loaded code was read from: the package's .py files (mtime, size) and the
    distributions installed beside it."""
    files = []
    for folder, subfolders, names in os.walk(PACKAGE_DIR):
        subfolders[:] = sorted(d for d in subfolders if d != "__pycache__")
        for name in sorted(names):
            if name.endswith(".py"):
                stat = os.stat(os.path.join(folder, name))
                files.append((folder, name, stat.st_mtime_ns, stat.st_size))
    installed = []
    for entry in sys.path:
        if entry.endswith("-packages") and os.path.isdir(entry):
            installed.append(sorted(n for n in os.listdir(entry) if n.endswith(".dist-info")))
    return [files, installed]


class Helper:
    """The accept loop and the children it waits for."""

    def __init__(self, path: str, run: Any) -> None:
        self.path, self.run = path, run
        self.loaded = fingerprint()
        self.started, self.served = time.time(), 0
        self.children: dict[int, socket.socket] = {}
        self.stopping = False
        self.selector = selectors.DefaultSelector()
        self.wakeup_read, self.wakeup_write = os.pipe()
        os.set_blocking(self.wakeup_read, False)
        os.set_blocking(self.wakeup_write, False)
        signal.set_wakeup_fd(self.wakeup_write)
        for sig in (signal.SIGCHLD, signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._note_signal)
        self.selector.register(self.wakeup_read, selectors.EVENT_READ, "signal")
        self.listener = self._listen()

    def _listen(self) -> socket.socket:
        other = connect(self.path, timeout=READ_SECONDS)
        if other is not None:  # two starts at once: the first one's stays
            other.close()
            raise SystemExit(f"another warm helper listens on {self.path}")
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        old = os.umask(0o177)  # the socket: this user only
        try:
            listener.bind(self.path)
        finally:
            os.umask(old)
        listener.listen(64)
        self.selector.register(listener, selectors.EVENT_READ, "listener")
        self.inode = os.stat(self.path).st_ino
        return listener

    def _note_signal(self, signum: int, frame: Any) -> None:
        if signum in (signal.SIGTERM, signal.SIGINT):
            self.stop(interrupt_children=True)

    def serve(self) -> None:
        print(f"warm helper {os.getpid()} listening on {self.path}", flush=True)
        while not (self.stopping and not self.children):
            for key, _ in self.selector.select(timeout=1.0):
                if key.data == "listener":
                    self._accept()
                elif key.data == "signal":
                    with contextlib.suppress(BlockingIOError):
                        os.read(self.wakeup_read, 512)
                    self._reap()
                else:
                    self._client_gone(key.fileobj, key.data)
            self._reap()  # a SIGCHLD's byte can be missed while another was pending
            if not self.stopping and not self._socket_is_ours():
                self.stop()  # removed, or another helper's now: no command can reach this one
        print(f"warm helper {os.getpid()} stopped after {self.served} run(s)", flush=True)

    def _socket_is_ours(self) -> bool:
        try:
            return os.stat(self.path).st_ino == self.inode
        except OSError:
            return False

    def stop(self, interrupt_children: bool = False) -> None:
        """No new request: the socket goes at once, the helper once its children ended."""
        if not self.stopping:
            self.stopping = True
            if self._socket_is_ours():
                with contextlib.suppress(OSError):
                    os.unlink(self.path)
            with contextlib.suppress(KeyError, ValueError):
                self.selector.unregister(self.listener)
            self.listener.close()
        if interrupt_children:
            for pid in self.children:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGTERM)

    def _accept(self) -> None:
        try:
            conn, _ = self.listener.accept()
        except OSError:
            return
        conn.settimeout(READ_SECONDS)
        try:
            if not self._same_user(conn):
                conn.close()
                return
            request, fds = receive_request(conn)
        except (OSError, ValueError, ConnectionError):
            conn.close()
            return
        try:
            self._answer(conn, request, fds)
        finally:
            for fd in fds:
                with contextlib.suppress(OSError):
                    os.close(fd)

    @staticmethod
    def _same_user(conn: socket.socket) -> bool:
        """Linux's check of the caller; elsewhere the socket's mode (0600) is the check."""
        if not hasattr(socket, "SO_PEERCRED"):
            return True
        creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12)
        return int.from_bytes(creds[4:8], sys.byteorder) == os.getuid()

    def _answer(self, conn: socket.socket, request: dict[str, Any], fds: list[int]) -> None:
        kind = request.get("kind")
        if kind == "ping":
            with conn:
                send_line(conn, self.status())
        elif kind == "stop":
            with conn:
                send_line(conn, {"stopping": True, "pid": os.getpid()})
            self.stop()
        elif kind == "run" and len(fds) == 3:
            if {k: request.get(k) for k in installation()} != installation() or (
                fingerprint() != self.loaded
            ):
                with conn:
                    send_line(conn, {"stale": True})
                print("stopping: replicator's files or the installed libraries changed", flush=True)
                self.stop()
                return
            self._fork(conn, request, fds)
        else:
            conn.close()

    def status(self) -> dict[str, Any]:
        return {
            "current": fingerprint() == self.loaded,  # False: replicator was upgraded since
            "pid": os.getpid(),
            "started": self.started,
            "served": self.served,
            "running": len(self.children),
            "socket": self.path,
            **installation(),
        }

    def _fork(self, conn: socket.socket, request: dict[str, Any], fds: list[int]) -> None:
        try:
            pid = os.fork()
        except OSError as exc:  # a process limit (EAGAIN): the command runs in its client
            print(f"a command ran without the helper: fork failed ({exc.strerror})", flush=True)
            with conn, contextlib.suppress(OSError):
                send_line(conn, {"refused": f"fork failed ({exc.strerror})"})
            return
        if pid == 0:
            self._become_command(conn, request, fds)  # never returns
        self.served += 1
        self.children[pid] = conn
        try:
            send_line(conn, {"pid": pid})
        except OSError:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
        conn.setblocking(False)
        self.selector.register(conn, selectors.EVENT_READ, pid)

    def _client_gone(self, conn: Any, pid: int) -> None:
        """The client closed its end mid-run (it never writes after its request)."""
        with contextlib.suppress(KeyError, ValueError):
            self.selector.unregister(conn)
        if pid in self.children:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)

    def _reap(self) -> None:
        while self.children:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            conn = self.children.pop(pid, None)
            if conn is None:
                continue
            with contextlib.suppress(KeyError, ValueError):
                self.selector.unregister(conn)
            with contextlib.suppress(OSError), conn:
                conn.setblocking(True)
                send_line(conn, {"exit": os.waitstatus_to_exitcode(status)})

    def _become_command(self, conn: socket.socket, request: dict[str, Any], fds: list[int]):
        """In the child: drop the helper's signals and sockets, take the client's place, run
        the command, send its exit code and exit."""
        code = 1
        try:
            signal.set_wakeup_fd(-1)
            for sig in (signal.SIGCHLD, *RELAYED):  # as a new process has them, not the helper's
                signal.signal(sig, signal.SIG_DFL)
            signal.signal(signal.SIGINT, signal.default_int_handler)  # Python's own
            self.selector.close()
            self.listener.close()
            os.close(self.wakeup_read)
            os.close(self.wakeup_write)
            for other in self.children.values():
                other.close()
            conn.settimeout(None)
            _take_place(request, fds)
            code = _run_command(self.run)
        except BaseException:
            traceback.print_exc()
        finally:
            with contextlib.suppress(Exception):
                sys.stdout.flush()
                sys.stderr.flush()
            with contextlib.suppress(OSError):
                send_line(conn, {"exit": code})
            os._exit(code)


def _take_place(request: dict[str, Any], fds: list[int]) -> None:
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
        os.close(fd)
    os.chdir(request["cwd"])
    os.umask(int(request["umask"]))
    for signum in request.get("ignored", []):  # `nohup`: the command outlives a hangup
        with contextlib.suppress(OSError, ValueError):
            signal.signal(int(signum), signal.SIG_IGN)
    _take_limits(request)
    os.environ.clear()
    os.environ.update(request["env"])
    time.tzset()
    sys.argv = list(request["argv"])
    sys.stdin = sys.__stdin__ = _stream(0, "r", sys.stdin)
    sys.stdout = sys.__stdout__ = _stream(1, "w", sys.stdout)
    sys.stderr = sys.__stderr__ = _stream(2, "w", sys.stderr)


def _take_limits(request: dict[str, Any]) -> None:
    """The client's nice value, CPU affinity and resource limits (`nice -n 19`, `taskset`,
    `ulimit` in a crontab), as far as an unprivileged process may take them: a nice value
    under the helper's, or a hard limit over its, stays the helper's. Not its cgroup."""
    with contextlib.suppress(OSError):
        os.setpriority(os.PRIO_PROCESS, 0, int(request["nice"]))
    if request.get("cpus") and hasattr(os, "sched_setaffinity"):
        with contextlib.suppress(OSError, ValueError):
            os.sched_setaffinity(0, request["cpus"])
    for name, (soft, hard) in request.get("limits", {}).items():
        kind = getattr(resource, name, None)
        if kind is not None:
            with contextlib.suppress(OSError, ValueError):
                resource.setrlimit(kind, (soft, hard))


def _stream(fd: int, mode: str, like: Any) -> io.TextIOWrapper:
    """A text stream on the client's descriptor, buffered as Python buffers its own: stdout
    by lines on a terminal, stderr always by lines."""
    encoding = getattr(like, "encoding", None) or "utf-8"
    errors = getattr(like, "errors", None) or "strict"
    forced = os.environ.get("PYTHONIOENCODING")
    if forced:
        name, _, handler = forced.partition(":")
        encoding, errors = name or encoding, handler or errors
    line_buffering = fd == 2 or (fd == 1 and os.isatty(fd))
    binary = open(fd, mode + "b", closefd=False)  # noqa: SIM115  (it lives as long as the child)
    return io.TextIOWrapper(binary, encoding, errors, line_buffering=line_buffering)


def _run_command(run: Any) -> int:
    """`replicator`'s own exit: SystemExit's code, 1 with a traceback for an error that got
    through, and a KeyboardInterrupt's death by SIGINT, as Python ends a script."""
    try:
        run()
    except SystemExit as exit_:
        code = exit_.code
        if code is None:
            return 0
        if isinstance(code, int):
            return code
        print(code, file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        sys.stdout.flush()
        sys.stderr.flush()
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
        return 130
    except BaseException:
        traceback.print_exc()
        return 1
    finally:
        _run_exit_functions()
    return 0


def _run_exit_functions() -> None:
    """What interpreter exit would run (the JVM's stop, pyspark's own)."""
    import atexit

    atexit._run_exitfuncs()


def main(path: str) -> None:
    # numpy (the log drain's rows, cdc/rows/copy_block.py: a slow import) loads OpenBLAS,
    # which starts a thread per core unless told not to; the helper forks, so it keeps none.
    # Nothing here calls BLAS.
    os.environ["OPENBLAS_NUM_THREADS"] = "1"
    gc.disable()
    try:
        from ..entry import COMMAND_MODULES
        from ..main import main as run

        for module in (*chain(*COMMAND_MODULES.values()), *DRAIN_MODULES):
            importlib.import_module(module)
    finally:
        gc.freeze()
        gc.enable()
    if sys.path and os.path.abspath(sys.path[0] or ".") == os.getcwd():
        del sys.path[0]  # `-m` put the start folder first: the children's folders differ
    Helper(path, run).serve()


if __name__ == "__main__":
    main(sys.argv[1])
