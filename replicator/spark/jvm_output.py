"""What the driver JVM and Spark's local Python workers print, as log records.

The JVM writes to the stderr it is started with: log4j's lines (a failed copy task's is a
Java stack trace around the task's Python traceback, about 35 lines per attempt: 150 for a
table whose task fails its four attempts), start-up notices, and what the Python workers
print (Spark copies their stderr there). The run reports each failure itself, in one line,
and under --log-format json every line on stderr must be a JSON object. So the JVM gets a
pipe instead, and each thing it says (a line and its continuation lines: a stack trace, a
traceback) becomes one debug record of `replicator.spark` (event `spark.output`), which -v
shows in the chosen format. Start-up noise is dropped.
"""

from __future__ import annotations

import logging
import os
import re
import threading

from ..base.readable import readable

log = logging.getLogger("replicator.spark")

IDLE_SECONDS = 0.2  # a record is complete once the JVM stays quiet this long
_NOISE = (
    "WARNING: Using incubator modules",
    'Setting default log level to "',
    "To adjust logging level use sc.setLogLevel",
)
_TRACEBACK = "Traceback (most recent call last):"
_CHAINED = ("During handling of the above exception", "The above exception was the direct cause")
# Lines that continue the record before them: indented (a stack frame, a traceback's source
# line), blank, a Java cause, or an exception's qualified class name
# (`org.apache...PythonException: ...`, `replicator...TaskError: ...`).
_CONTINUATION = re.compile(r"\s|$|Caused by: |Suppressed: |(?:[a-z_][\w$]*\.)+[A-Z][\w$]*(?::|$)")


def continues(record: list[str], line: str) -> bool:
    """Whether `line` belongs to the record made of `record`'s lines so far: also a Python
    traceback's last line (`ZeroDivisionError: ...`) after its indented frames, and the
    chained traceback after `During handling of the above exception ...`."""
    if _CONTINUATION.match(line) or line.startswith(_CHAINED):
        return True
    if line.startswith(_TRACEBACK):
        said = [earlier for earlier in record if earlier.strip()]
        return bool(said) and said[-1].startswith(_CHAINED)
    in_traceback = any(_TRACEBACK in earlier for earlier in record)
    return in_traceback and record[-1][:1].isspace()


class Records:
    """Lines in, records out: a record is complete when a line does not continue it (or
    the JVM went quiet: `flush`)."""

    def __init__(self) -> None:
        self._lines: list[str] = []

    @property
    def open(self) -> bool:
        return bool(self._lines)

    def add(self, line: str) -> str | None:
        """Take a line; the record it completed, if any."""
        if line.startswith(_NOISE):
            return None
        done = self.flush() if self._lines and not continues(self._lines, line) else None
        self._lines.append(line)
        return done

    def flush(self) -> str | None:
        """The record so far (None when it is only blank lines)."""
        text, self._lines = "\n".join(self._lines).rstrip(), []
        return text or None


class JvmOutput:
    """A pipe to give the JVM as its stderr, and the thread that logs what comes out."""

    def __init__(self) -> None:
        read_end, self.write_end = os.pipe()
        self.first: str | None = None  # what the JVM said first (why it did not start)
        self._thread = threading.Thread(
            target=self._read, args=(read_end,), name="jvm-stderr", daemon=True
        )
        self._thread.start()

    def launched(self) -> None:
        """Close this process's copy of the write end (the JVM has its own): the reader
        ends once the JVM and its workers are gone."""
        os.close(self.write_end)

    def first_words(self, timeout: float) -> str | None:
        """The first record, once a JVM that exited has said everything (or at timeout)."""
        self._thread.join(timeout)
        return self.first

    def _read(self, fd: int) -> None:
        records = Records()
        pending = b""
        while True:
            if records.open and not readable(fd, IDLE_SECONDS):
                self._emit(records.flush())
                continue
            chunk = os.read(fd, 65536)
            if not chunk:
                break
            *lines, pending = (pending + chunk).split(b"\n")
            for line in lines:
                self._emit(records.add(line.decode(errors="replace").rstrip("\r")))
        os.close(fd)
        if pending:
            self._emit(records.add(pending.decode(errors="replace")))
        self._emit(records.flush())

    def _emit(self, record: str | None) -> None:
        if record is not None:
            self.first = self.first or record
            log.debug("spark: %s", record, extra={"fields": {"event": "spark.output"}})
