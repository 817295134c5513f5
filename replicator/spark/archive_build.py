"""Dump Spark's driver class archive from a run's class list, detached from that run
(jvm_archive.py): `python -I -S archive_build.py FINAL LIST JAVA [OPTION...]`.

Standard library only, started with -I -S: the run waits for its first line, so it must start
at once. It copies the list (the run's JVM may still be adding to it), says `taken`
so that the run drops its own, then runs `java -Xshare:dump` with the JVM's own options at
low priority and renames the archive into place. Each of its files names its pid, so a run
that finds them knows whether a build is still going. The dump's output goes to
FINAL.log, the one place that says why an archive never appeared.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

NICENESS = 10  # the dump takes about 20 s of one core; whatever runs meanwhile goes first


def main(argv: list[str]) -> int:
    final, listed, java = Path(argv[1]), Path(argv[2]), argv[3:]
    own = final.with_name(f"{final.name}.classes-{os.getpid()}")
    dumped = final.with_name(f"{final.name}.tmp-{os.getpid()}")
    try:
        text = listed.read_bytes()
        own.write_bytes(text[: text.rfind(b"\n") + 1])  # whole lines: the JVM may be writing
        print("taken", flush=True)
        sys.stdout.close()
        os.nice(NICENESS)
        if final.is_file():  # made meanwhile: nothing to do
            return 0
        with open(final.with_name(f"{final.name}.log"), "wb") as log:
            code = subprocess.run(
                [
                    *java,
                    "-Xshare:dump",
                    f"-XX:SharedClassListFile={own}",
                    f"-XX:SharedArchiveFile={dumped}",
                ],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                check=False,
            ).returncode
        if code == 0 and dumped.is_file() and dumped.stat().st_size > 0:
            os.replace(dumped, final)
            return 0
        return 1
    finally:
        own.unlink(missing_ok=True)
        dumped.unlink(missing_ok=True)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
