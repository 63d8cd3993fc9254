{#-
  How dbt lists a schema's relations (its relation cache, filled at the start of every invocation).

  dbt-spark asks `show table extended`, which Spark 3.5 refuses for v2 catalogs such as Iceberg's (SPARK-33393);
  its fallback then runs `describe extended` once per table of every schema the project touches, so each `dbt
  run` costs a statement per bronze and silver table of the lakehouse, whichever models it selects. In an Iceberg
  catalog (`org.apache.iceberg.spark.SparkCatalog`) every table is an Iceberg table, so one `show tables` per
  schema tells dbt all it uses: the names, that each is a table, and that its provider is Iceberg. (Neither path
  lists views of a v2 catalog: `show tables` does not return them.) Any other catalog, Spark's session catalog
  included, keeps dbt-spark's listing.

  dbt finds this macro when the project dispatches the `dbt` namespace through the package (dbt_project.yml):
    dispatch:
      - macro_namespace: dbt
        search_order: ['<your project>', 'cdclake', 'dbt']
-#}
{% macro spark__list_relations_without_caching(relation) %}
  {%- if not cdclake.is_iceberg_catalog() -%}
    {{ return(dbt.spark__list_relations_without_caching(relation)) }}
  {%- endif -%}
  {#- Rows as dbt-spark reads `show table extended`: namespace, name, isTemporary, information. Temporary views
      (listed with every namespace) belong to no schema. -#}
  {%- set rows = [] -%}
  {%- for row in run_query('show tables in ' ~ relation.schema ~ " like '*'") if not row[2] -%}
    {% do rows.append([row[0], row[1], row[2], 'Type: MANAGED\nProvider: iceberg\n']) %}
  {%- endfor -%}
  {{ return(rows) }}
{% endmacro %}


{#- Whether table `identifier` exists in `schema` (`[catalog.]namespace`): one `show tables` narrowed to its name. A
    bronze table is looked up so, not through dbt's relation cache (adapter.get_relation), which dbt fills for the
    selected models' schemas only: its miss on bronze's schema lists all of it, three statements
    (spark__list_relations_without_caching above). A name the pattern would not read literally is looked for in
    the whole listing. -#}
{% macro table_exists(schema, identifier) -%}
  {%- set pattern = identifier if modules.re.fullmatch('[A-Za-z0-9_]+', identifier) else '*' -%}
  {%- for row in run_query('show tables in ' ~ schema ~ " like '" ~ pattern ~ "'").rows if not row[2] and row[1] | lower == identifier | lower -%}
    {{ return(true) }}
  {%- endfor -%}
  {{ return(false) }}
{%- endmacro %}


{#- Whether the session's current catalog is an Iceberg catalog (which holds Iceberg tables only). -#}
{% macro is_iceberg_catalog() -%}
  {{ return(cdclake.spark_setting('spark.sql.catalog.' ~ cdclake.current_catalog()) == 'org.apache.iceberg.spark.SparkCatalog') }}
{%- endmacro %}


{#- The session's current catalog, which every dbt invocation asks while it lists its schemas. `show current
    namespace` is a command: 9-17 ms a call here, against 34-59 ms for the query `select current_catalog()`. -#}
{% macro current_catalog() -%}
  {{ return(run_query('show current namespace').rows[0][0]) }}
{%- endmacro %}


{#- A Spark setting of the session, or none when unset (backquoted: a key such as `...io-impl` has a dash). -#}
{% macro spark_setting(name) -%}
  {%- set value = run_query('set `' ~ name ~ '`').rows[0][1] -%}
  {{ return(none if value == '<undefined>' else value) }}
{%- endmacro %}


{#- The name of a temporary view of this model's run. Models run by `--threads N` share one SparkSession, whose
    temporary views are one namespace: the schema keeps two models of one alias (in two schemas) apart. -#}
{% macro session_view(suffix) -%}
  {{ return(model.schema ~ '__' ~ model.alias ~ suffix) }}
{%- endmacro %}
