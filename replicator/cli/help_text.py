"""The texts `replicator --help` teaches with: examples, the environment, the exit codes."""

from __future__ import annotations

ENVIRONMENT = """\b
Environment (or the project's .env; the environment wins):
  REPLICATOR_SOURCE_URL         the source database (libpq URI or key=value)
  REPLICATOR_DEST_URL           the destination database
  REPLICATOR_WEBHOOK_URL        overrides webhook.url
  REPLICATOR_WEBHOOK_SECRET     overrides webhook.secret (HMAC signing key)
  REPLICATOR_SPARK_MASTER       overrides spark.master
  REPLICATOR_SPARK_MIN_ROWS     overrides spark.min_rows
  REPLICATOR_SPARK_REMOTE       overrides spark.remote (a Spark Connect server, sc://host:port)
  REPLICATOR_PROGRESS_INTERVAL  seconds between progress log lines off a terminal (10)
  REPLICATOR_HASH_SALT          the salt of `columns.hash` (a secret: never printed)
  REPLICATOR_CACHE_DIR          the cache folder (~/.cache/replicator; off: none)
  REPLICATOR_WARM               off: run without the warm helper (replicator warm start)
  REPLICATOR_JDBC_JAR           the PostgreSQL JDBC driver's jar for Spark"""

EXIT_CODES = """\b
Exit codes:
  0        success
  1        one or more tables failed (the others were still handled)
  2        bad usage or config; nothing was touched
  75       another replicator holds the lock (run again later)
  130/143  interrupted by SIGINT/SIGTERM (what it had started was rolled back)
  129      interrupted by SIGHUP: its terminal closed (nohup ignores it)"""

EXAMPLES = """\b
Examples:
  replicator init my-pipeline
  replicator check --project-dir my-pipeline
  replicator sync --project-dir my-pipeline
  replicator --project-dir my-pipeline status
  replicator sync -s public.orders -f       # reload one table now
  replicator verify --repair                # prove every copy; fix the rows that differ
  replicator sync -q --log-format json      # for cron and log shippers"""


def examples(*lines: str) -> str:
    return "\b\nExamples:\n" + "\n".join(f"  {line}" for line in lines)
