"""Telling people and machines what happened: table results, the terminal and log output
(progress, summary), the webhook, OpenLineage events (`lineage`, and `lineage_events` only
when configured), and the log formats.

May import: base, project, postgres, plan, transfer, spark, compare, cdc.
"""
