"""Where a cron run's time goes: a 1% batch caught up by a plain `replicator sync` process,
against hand SQL, and the run profiled from exec to exit.

Two throwaway clusters, the table of bench/incremental.py (--rows rows, `updated_at`
indexed), copied once by replicator and once by pg_dump (the hand copy, with an UNLOGGED
staging table). Each round updates 1% of the rows with a new `updated_at`, then, each after
a checkpoint of both clusters:
- hand SQL: `psql` reads the copy's newest `updated_at`, COPYs the newer rows into the
  staging table, and merges them with INSERT ... ON CONFLICT DO UPDATE (bench/peers.py's);
- `replicator sync -q` as cron runs it (its own process, lookback 0 as in bench/peers.py);
- the same run under py-spy (`--idle --nonblocking --threads`, 250 Hz: at 1 kHz it took a
  core from the databases; installed into bench/.peers-venv), whose main thread's samples
  are sorted into the run's phases by the functions on their stacks. The table gives each
  phase its share of the samples times the plain runs' median less the interpreter's own
  start and exit (`python -c pass`, timed apart): py-spy sees no frame before the first
  one, and drops a sample it could not read.
Every copy is checked against the source (count and md5 of every row) after each round.

    .venv/bin/python bench/cron_run.py                  # 5M rows, 3 rounds
    .venv/bin/python bench/cron_run.py --rows 500000 --repeat 1
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path

import incremental
import psycopg
from incremental import MERGE
from one_table_run import DIGEST, two_clusters

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from replicator.postgres.pgcluster import find_pg_bin

BENCH = Path(__file__).resolve().parent
PEERS_VENV = BENCH / ".peers-venv"
RATE = 250  # a higher rate takes a core from the databases (2 here) and slows the copy
CHANGE = (
    "UPDATE bench_orders SET amount = amount + 1, updated_at = clock_timestamp() "
    "WHERE id %% 100 = %s"
)

# A sample's phase, unless it imports (then: whose module body runs, _import_phase): the first
# of these (in this order) found among its frames (`name (file:line)` in py-spy's raw output;
# a regular expression on the name and file).
PHASES = [
    ("config: tables-config.json, pydantic", r"^(load_config|parse_config) "),
    (
        "settings: .env, connections",
        r"^(Environment\.load|Settings\.resolve|Connections\.from_env)",
    ),
    ("macros: jinja2", r"^(Project\.templates|Templates\.__init__) "),
    ("connections opened", r"^connect \(replicator/postgres/database"),
    ("the run's lock", r"^run_lock "),
    ("catalogs read ahead", r"^read_ahead "),
    ("no-op screen: probe and plan", r"^screen_noops "),
    ("the table's lock", r"^table_lock "),
    ("copy and merge", r"^(incremental_sync|stream_in_parts|copy_and_merge) "),
    ("plan under the lock, probe", r"^(_sync_locked_table|carry_out) "),
    ("state written", r"^(_flush_states|StateStore\.) "),
    ("history row and metrics file", r"^record_run "),
    ("webhook and lineage", r"^(_notify|RunLineage\.) "),
    ("the run's rest (log lines, results)", r"^run_sync "),
    ("command line (click) and exit", r"\(click/|^main \(replicator/cli/"),
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=5_000_000)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    spy = py_spy()
    with two_clusters("replicator-bench-cron-") as (base, source, dest):
        hand = build(source, dest, args.rows)
        project = base / "project"
        (project / "sync-state").mkdir(parents=True)
        (project / "tables-config.json").write_text(
            '{"tables": [{"name": "public.bench_orders", "replication_key": "updated_at",'
            ' "lookback": 0}]}'
        )
        env = {**os.environ, "REPLICATOR_SOURCE_URL": source, "REPLICATOR_DEST_URL": dest}
        env.pop("REPLICATOR_SPARK_MIN_ROWS", None)
        sync = [sys.executable, "-m", "replicator", "sync", "-q", "--project-dir", str(project)]
        timed(sync, env)  # the first load, untimed
        times: dict[str, list[float]] = collections.defaultdict(list)
        phases: collections.Counter[str] = collections.Counter()
        for round_no in range(1, args.repeat + 1):
            with psycopg.connect(source, autocommit=True) as conn:
                conn.execute(CHANGE, (round_no,))
                conn.execute("SELECT count(*) FROM bench_orders")  # hint bits, for all
            settle(source, dest)
            times["hand SQL"].append(timed(["bash", "-c", by_hand(source, hand)], env))
            settle(source, dest)
            times["replicator sync"].append(timed(sync, env))
            exact(source, dest, hand)
            # the profiled run catches up a round of its own
            with psycopg.connect(source, autocommit=True) as conn:
                conn.execute(CHANGE, (50 + round_no,))
            settle(source, dest)
            out = base / f"profile-{round_no}.txt"
            command = [spy, "record", "--idle", "--nonblocking", "--threads", "-r", str(RATE)]
            command += ["-f", "raw", "-o", str(out), "--", *sync]
            wall = timed(command, env)
            add_phases(out.read_text(), phases)
            times["replicator sync under py-spy"].append(wall)
            timed(["bash", "-c", by_hand(source, hand)], env)  # the hand copy catches up too
            exact(source, dest, hand)
            print(f"round {round_no}: " + ", ".join(f"{k} {v[-1]:.2f} s" for k, v in times.items()))
    report(args, times, phases, bare_start())


def py_spy() -> str:
    python = PEERS_VENV / "bin" / "python"
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", str(PEERS_VENV)], check=True)
    program = PEERS_VENV / "bin" / "py-spy"
    if not program.exists():
        subprocess.run([str(python), "-m", "pip", "install", "-q", "py-spy"], check=True)
    return str(program)


def build(source: str, dest: str, rows: int) -> str:
    """The source table, and the hand copy's database: its staging table (bench/incremental.py
    builds both), then pg_dump's table."""
    with psycopg.connect(dest, autocommit=True) as conn:
        conn.execute("CREATE DATABASE hand")
    hand = dest.rsplit("/", 1)[0] + "/hand"
    incremental.build(source, hand, rows)
    bin_dir = find_pg_bin()
    subprocess.run(
        f"{bin_dir / 'pg_dump'} -t bench_orders {shlex.quote(source)} | "
        f"{bin_dir / 'psql'} -q -v ON_ERROR_STOP=1 {shlex.quote(hand)}",
        shell=True,
        check=True,
        capture_output=True,
    )
    return hand


def by_hand(source: str, hand: str) -> str:
    psql = shlex.quote(str(find_pg_bin() / "psql"))
    src, dst = shlex.quote(source), shlex.quote(hand)
    newest = shlex.quote("SELECT max(updated_at) FROM bench_orders")
    copy_out = "\\copy (SELECT * FROM bench_orders WHERE updated_at > '$since') TO STDOUT"
    copy_in = shlex.quote("\\copy stage FROM STDIN")
    return (
        f"since=$({psql} {dst} -Atc {newest}) && "
        f'{psql} {src} -c "{copy_out}" | {psql} {dst} -c {copy_in} && '
        f"{psql} {dst} -v ON_ERROR_STOP=1 -c {shlex.quote(MERGE)}"
    )


def settle(*urls: str) -> None:
    for url in urls:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("CHECKPOINT")
    os.sync()


def timed(command: list[str], env: dict[str, str]) -> float:
    started = time.monotonic()
    done = subprocess.run(
        command, env=env, capture_output=True, text=True, stdin=subprocess.DEVNULL
    )
    seconds = time.monotonic() - started
    if done.returncode != 0:
        raise SystemExit(f"{command[0]} failed ({done.returncode}):\n{done.stderr[-2000:]}")
    return seconds


def exact(source: str, dest: str, hand: str) -> None:
    with psycopg.connect(source) as s, psycopg.connect(dest) as d, psycopg.connect(hand) as h:
        want = s.execute(DIGEST).fetchone()
        if d.execute(DIGEST).fetchone() != want or h.execute(DIGEST).fetchone() != want:
            raise SystemExit("a copy differs from the source")


def add_phases(raw: str, phases: collections.Counter[str]) -> float:
    """The main thread's samples of one profile, into `phases`; the seconds they cover."""
    samples = []
    for line in raw.splitlines():
        stack, _, count = line.rpartition(" ")
        thread, _, frames = stack.partition(";")
        tid = re.match(r"thread \((\d+)\)", thread)
        if tid and frames:
            samples.append((tid[1], frames.split(";"), int(count)))
    main = next(
        t for t, f, _ in samples if any(x.startswith("<module> (replicator/__main__") for x in f)
    )
    seen = 0
    for tid, frames, count in samples:
        if tid == main:
            phases[phase_of(frames)] += count
            seen += count
    return seen / RATE


def phase_of(frames: list[str]) -> str:
    modules = [i for i, f in enumerate(frames) if f.startswith("<module> (")]
    if any(f.startswith("_find_and_load ") for f in frames) and modules:
        return _import_phase(frames, modules[-1])
    for name, pattern in PHASES:
        if any(re.search(pattern, f) for f in frames):
            return name
    return "other"


def _import_phase(frames: list[str], innermost: int) -> str:
    """An import's sample: whose module body runs (the innermost one), and for replicator's
    own, whether pydantic (a config model's schema) or dataclasses (a class made) runs in it."""
    where = frames[innermost].split("(", 1)[1]
    if where.startswith("replicator/"):
        below = " ".join(frames[innermost + 1 :])
        if "(pydantic" in below:
            return "imports: replicator's config models built by pydantic"
        if "(dataclasses.py" in below:
            return "imports: replicator's dataclasses made"
        return "imports: replicator's own modules, the rest"
    package = re.split(r"[/.:]", where, maxsplit=1)[0]
    if package in ("psycopg", "psycopg_binary", "pydantic", "pydantic_core", "jinja2", "click"):
        return f"imports: {package.split('_')[0]}"
    return "imports: other libraries and the standard library"


def report(args, times, phases, bare: float) -> None:
    hand = statistics.median(times["hand SQL"])
    print(f"\n{args.rows:,} rows, 1% changed per round, {args.repeat} round(s):\n")
    print("| run | rounds (s) | median | / hand SQL |\n|---|---|---|---|")
    for name, values in times.items():
        median = statistics.median(values)
        rounds = ", ".join(f"{v:.2f}" for v in values)
        print(f"| {name} | {rounds} | {median:.2f} s | {median / hand:.2f}x |")
    plain = statistics.median(times["replicator sync"])
    samples = sum(phases.values())
    print(f"\nWhere a plain run's {plain:.2f} s go (py-spy's shares of the main thread):\n")
    print("| phase | ms | share |\n|---|---|---|")
    rows = [("the interpreter's start and exit (`python -c pass`)", bare)]
    rows += [(name, (plain - bare) * count / samples) for name, count in phases.items()]
    for name, seconds in sorted(rows, key=lambda r: -r[1]):
        print(f"| {name} | {1000 * seconds:.0f} | {seconds / plain:.0%} |")


def bare_start() -> float:
    """The interpreter's own start and exit, the median of five."""
    return statistics.median(
        timed([sys.executable, "-c", "pass"], dict(os.environ)) for _ in range(5)
    )


if __name__ == "__main__":
    main()
