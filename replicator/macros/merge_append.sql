{#- incremental-append: insert the staged batch as new rows; the engine stages only rows not
    appended before. Arguments arrive quoted. -#}
{% macro merge_append(target, staging, columns) -%}
INSERT INTO {{ target }} ({{ columns | join(", ") }})
SELECT {{ columns | join(", ") }}
FROM {{ staging }}
{%- endmacro %}
