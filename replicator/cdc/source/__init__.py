"""The source side of log capture: the replication slot (`slot`, its health, its WAL and an
unused one), a load's snapshot with its log position (`slot_snapshot`), the publication a
table is listed in (`log_filter`, `dba_publication`), the slot streamed over the replication
protocol (`log_stream`) and its messages decoded (`pgoutput`).

May import: base, project, postgres, plan.
"""
