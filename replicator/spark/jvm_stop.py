"""The driver JVM stopped before the CLI exits, not after it.

Left alone, the JVM notices its parent is gone only when its stdin pipe breaks, and lingers
for seconds with Spark's Python workers (a cron wrapper or a container runtime would see
processes of a finished run). Stopping the context first ends the executors and their
Python workers; closing the gateway's stdin then makes the JVM exit, running its shutdown
hooks.

pyspark's own stop waits for its accumulator thread, which looks for a stop once a second:
most of a second at the end of every Spark run. No job runs after the stop, so
nothing is sent to that thread any more: it is told to end and not waited for.
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
import threading
from typing import Any

from ..base.interrupts import requested

STOP_SECONDS = 30.0  # a clean stop and exit takes a fraction of a second
INTERRUPTED_SECONDS = 3.0  # after SIGTERM / SIGINT: then it is killed


def stop_jvm(context: Any, *, graceful: bool) -> bool:
    """Stop the context and wait for the JVM to exit, killing it past the deadline (short
    when not `graceful`: the run was interrupted); True when it exited by itself.

    The context is stopped first even then: a JVM that dies under a live context makes
    pyspark's accumulator thread print an EOFError traceback."""
    from pyspark import SparkContext

    if context is not None:
        _let_accumulators_go(context)
        with contextlib.suppress(Exception):
            context.stop()
    gateway = SparkContext._gateway
    if gateway is None:
        return True
    proc: subprocess.Popen[bytes] | None = getattr(gateway, "proc", None)
    with contextlib.suppress(Exception):
        gateway.shutdown()
    SparkContext._gateway = None
    SparkContext._jvm = None
    SparkContext._active_spark_context = None
    if proc is None:
        return True
    with contextlib.suppress(Exception):
        if proc.stdin:
            proc.stdin.close()  # the gateway exits on EOF
    try:
        proc.wait(timeout=STOP_SECONDS if graceful else INTERRUPTED_SECONDS)
        return True
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        return False


def _let_accumulators_go(context: Any) -> None:
    """End the context's accumulator server without waiting for its poll. Its connection
    from the JVM closes as the JVM exits, which the thread may read first: an error that
    is nobody's, so not printed."""
    server = getattr(context, "_accumulatorServer", None)
    if server is None:
        return
    context._accumulatorServer = None  # SparkContext.stop() would wait for it
    server.handle_error = lambda request, client_address: None
    threading.Thread(target=server.shutdown, name="spark-accumulators-stop", daemon=True).start()


def jvm_pid() -> int | None:
    """This process's driver JVM (pyspark's launcher execs into it), if it started one."""
    from pyspark import SparkContext

    process = getattr(SparkContext._gateway, "proc", None)
    return process.pid if process is not None else None


def stop_spark_on_exit() -> None:
    """The console script's last step: stop this process's Spark, if it started one (and
    without importing pyspark when it did not)."""
    if "pyspark" not in sys.modules:
        return
    from pyspark import SparkContext

    if SparkContext._gateway is not None:
        stop_jvm(SparkContext._active_spark_context, graceful=requested() is None)
