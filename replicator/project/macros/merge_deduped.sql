{#- incremental-deduped: upsert the staged batch by primary key. The batch is reduced to one
    row per key first (highest replication key wins, ties broken by the row's text), and
    only rows whose text differs are rewritten: replaying a batch changes nothing.
    Arguments arrive quoted. -#}
{% macro merge_deduped(target, staging, columns, key_columns, update_columns, replication_key) -%}
INSERT INTO {{ target }} AS t ({{ columns | join(", ") }})
SELECT DISTINCT ON ({{ key_columns | join(", ") }}) {{ columns | join(", ") }}
FROM {{ staging }} AS s
ORDER BY {{ key_columns | join(", ") }}, {{ replication_key }} DESC, s::text DESC
{% if update_columns -%}
ON CONFLICT ({{ key_columns | join(", ") }}) DO UPDATE SET
  {% for c in update_columns %}{{ c }} = EXCLUDED.{{ c }}{{ ",\n  " if not loop.last }}{% endfor %}
WHERE (t.*)::text IS DISTINCT FROM (EXCLUDED.*)::text
{%- else -%}
ON CONFLICT ({{ key_columns | join(", ") }}) DO NOTHING
{%- endif %}
{%- endmacro %}
