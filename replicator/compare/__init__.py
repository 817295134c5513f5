"""Comparing a table's two sides: range checksums in one snapshot per side, bisection of the
ranges that differ, the row-by-row diff of small ranges, and the repair of exactly those rows
(`verify`, and the delete checks of cursor tables). The first pass over a large table runs as
Spark tasks (range_task, kept light for Spark's Python workers). A copy's history table is
checked against the copy and repaired by closing and opening versions (history_check).

May import: base, project, postgres, plan, transfer, spark.
"""
