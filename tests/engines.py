"""Which engine a test's copies take (spark/engine_choice.py).

The suite sends every copy through Spark (conftest.py sets REPLICATOR_SPARK_MIN_ROWS=0): its
tables are small. A test whose point does not depend on the engine (a failpoint after the
copy, what a command prints) copies in the replicator process instead: a `replicator`
process that starts no JVM costs about 1.5 CPU-seconds against about 8 with one, and the
suite's time is its CPU. The tests of the Spark path keep it.
"""

IN_PROCESS = {"REPLICATOR_SPARK_MIN_ROWS": "1000000000"}
