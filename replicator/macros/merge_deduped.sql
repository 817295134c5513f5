{#- incremental-deduped: upsert the staged batch (one row per key) by primary key, and only
    rewrite rows whose values differ, so replaying a batch changes nothing.
    Arguments arrive quoted; `compare` holds each non-key column's comparable form. -#}
{% macro merge_deduped(target, staging, columns, key_columns, update_columns) -%}
INSERT INTO {{ target }} AS t ({{ columns | join(", ") }})
SELECT {{ columns | join(", ") }}
FROM {{ staging }}
{% if update_columns -%}
ON CONFLICT ({{ key_columns | join(", ") }}) DO UPDATE SET
  {% for c in update_columns %}{{ c }} = EXCLUDED.{{ c }}{{ ",\n  " if not loop.last }}{% endfor %}
WHERE ({% for c in update_columns %}t.{{ c }}{{ ", " if not loop.last }}{% endfor %})
  IS DISTINCT FROM ({% for c in update_columns %}EXCLUDED.{{ c }}{{ ", " if not loop.last }}{% endfor %})
{%- else -%}
ON CONFLICT ({{ key_columns | join(", ") }}) DO NOTHING
{%- endif %}
{%- endmacro %}
