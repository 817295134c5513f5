"""A logged change made into its staging row: one at a time (`copy_rows`, `binary_rows`)
or many at once with numpy (`copy_block`, `binary_block`), in text or binary form
(`binary_values` decides), with `columns` applied (`shaped_log`); and staged into a
temporary table per table (`stage`, `table_stage`).

May import: base, project, postgres, plan, and the `source` room (the decoder's values).
"""
