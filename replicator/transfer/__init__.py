"""Moving rows: the COPY task every partition runs (copy_stream, imported by Spark's Python
workers, so it stays light), the tasks' construction, load ids and partition markers,
partition planning, progress, and Spark itself (runner, session, worker daemon, JVM archive).

May import: base, project, postgres (plan only through the values its callers pass).
"""
