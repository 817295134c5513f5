"""`replicator sync`: the run (`run`: lock, tables one at a time, webhook), what a run's
tables share (`context`), the no-op screen of untouched cursor tables (`noop_screen`,
`probe_many`), what each planned table goes through (`table_actions`, with the statements of
each action in `scripts` and `action_scripts`, which `compile` prints too), and after the run
its history and metrics (`run_record`); one room for each way a table is kept current:
`full_load/`, `incremental/` and `cdc/`.

May import: base, project, postgres, plan, transfer, spark, compare, cdc, report.
"""
