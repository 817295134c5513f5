{#- incremental-deduped: upsert the staged batch by primary key. The batch is reduced to one
    row per key first (highest replication key wins, ties broken by the row's text), unless
    `unique_keys` says it cannot hold a key twice (the source's own key, read in one
    snapshot: a sort saved); only rows whose text differs are rewritten: replaying a batch
    changes nothing. A new replication key value is a new text (values that differ by the
    type's equality print differently), so most changed rows skip the comparison of both
    rows' text. Arguments arrive quoted. -#}
{% macro merge_deduped(target, staging, columns, key_columns, update_columns, replication_key, unique_keys=false) -%}
INSERT INTO {{ target }} AS t ({{ columns | join(", ") }})
{% if unique_keys -%}
SELECT {{ columns | join(", ") }}
FROM {{ staging }} AS s
{% else -%}
SELECT DISTINCT ON ({{ key_columns | join(", ") }}) {{ columns | join(", ") }}
FROM {{ staging }} AS s
ORDER BY {{ key_columns | join(", ") }}, {{ replication_key }} DESC, s::text DESC
{% endif -%}
{% if update_columns -%}
ON CONFLICT ({{ key_columns | join(", ") }}) DO UPDATE SET
  {% for c in update_columns %}{{ c }} = EXCLUDED.{{ c }}{{ ",\n  " if not loop.last }}{% endfor %}
WHERE t.{{ replication_key }} IS DISTINCT FROM EXCLUDED.{{ replication_key }}
   OR (t.*)::text IS DISTINCT FROM (EXCLUDED.*)::text
{%- else -%}
ON CONFLICT ({{ key_columns | join(", ") }}) DO NOTHING
{%- endif %}
{%- endmacro %}
