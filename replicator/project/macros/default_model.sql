{#- The SELECT a table's sync reads when the project has no models/<schema>/<table>.sql:
    every column of the source table, in order. Arguments arrive quoted. -#}
{% macro default_model(source, columns) -%}
SELECT {{ columns | join(", ") }}
FROM {{ source }}
{%- endmacro %}
