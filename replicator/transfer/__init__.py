"""Moving rows: the COPY task every partition runs (copy_stream, imported by Spark's Python
workers, so it stays light), the tasks' construction, load ids and partition markers,
partition planning and progress. Where the tasks run is the `spark` wing's.

May import: base, project, postgres (plan only through the values its callers pass).
"""
