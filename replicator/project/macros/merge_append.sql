{#- incremental-append: insert the staged rows whose key the destination does not hold yet.
    Rows already appended (read again at the cursor boundary, or after a crash between the
    commit and the state write) are skipped by the key: nothing is ever appended twice, and
    rows already there are never updated. Arguments arrive quoted. -#}
{% macro merge_append(target, staging, columns, key_columns) -%}
INSERT INTO {{ target }} ({{ columns | join(", ") }})
SELECT {{ columns | join(", ") }}
FROM {{ staging }}
ON CONFLICT ({{ key_columns | join(", ") }}) DO NOTHING
{%- endmacro %}
