"""`replicator check`: the checks (`checks`) of Spark (`spark_checks`), log capture
(`capture_checks`) and extension types (`type_checks`), each a line (`findings`), the lines of
a pattern's tables summed up.

May import: every layer below commands.
"""
