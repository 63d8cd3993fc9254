{#-
  What the materialization needs to know about a bronze table (written by `cdclake ingest`) and the model's SQL:
  the key columns and how to read them, the image columns, extracted columns, and the incremental input.
-#}

{% macro bronze_relation() -%}
  {%- if model.sources | length != 1 -%}
    {{ exceptions.raise_compiler_error("cdc_silver model '" ~ model.name ~ "' must select from exactly one bronze source() (found " ~ (model.sources | length) ~ ")") }}
  {%- endif -%}
  {{ return(source(model.sources[0][0], model.sources[0][1])) }}
{%- endmacro %}


{% macro describe_columns(relation) -%}
  {%- set types = {} -%}
  {%- if not execute %}{{ return(types) }}{% endif -%}
  {%- for row in run_query('describe table ' ~ relation).rows -%}
    {%- if row[0] and not row[0].startswith('#') and row[0] not in types -%}{% do types.update({row[0]: row[1]}) %}{%- endif -%}
    {%- if row[0] and row[0].startswith('#') %}{% break %}{% endif -%}
  {%- endfor -%}
  {{ return(types) }}
{%- endmacro %}


{% macro struct_field_names(relation, column) -%}
  {%- if not execute %}{{ return([]) }}{% endif -%}
  {{ return(run_query('select ' ~ column ~ '.* from ' ~ relation ~ ' where false').column_names | list) }}
{%- endmacro %}


{#- Keys, image columns and expressions for one model. Fails with a clear message for a table without a key. -#}
{% macro silver_layout(bronze, input_sql) -%}
  {%- set types = cdclake.describe_columns(bronze) -%}
  {%- set key_type = types.get('key', '') -%}
  {%- set after_type = types.get('after', '') -%}
  {%- set typed_key = key_type.startswith('struct') -%}
  {%- set document = not after_type.startswith('struct') -%}
  {%- set keys = config.get('keys') -%}
  {%- if keys is string %}{% set keys = [keys] %}{% endif -%}
  {%- if not keys -%}
    {%- set keys = cdclake.struct_field_names(bronze, 'key') if typed_key else [] -%}
  {%- endif -%}
  {%- if not keys -%}
    {{ exceptions.raise_compiler_error("cdc_silver model '" ~ model.name ~ "': bronze table " ~ bronze ~ " has no key (the source table has no primary key, or records carry no key schema); name the key columns with config(keys=[...])") }}
  {%- endif -%}
  {%- set key_exprs = {} -%}
  {%- for key in keys -%}
    {%- if typed_key -%}{% do key_exprs.update({key: 'key.' ~ cdclake.quote(key)}) %}
    {%- else -%}{% do key_exprs.update({key: cdclake.json_key_expr(key)}) %}{%- endif -%}
  {%- endfor -%}
  {%- set image_columns = [] -%}
  {%- if not document -%}
    {%- set include = config.get('columns') -%}
    {%- set exclude = config.get('exclude_columns') or [] -%}
    {%- for column in cdclake.struct_field_names(bronze, 'after') -%}
      {%- if column | lower not in keys | map('lower') | list and (not include or column in include) and column not in exclude -%}
        {% do image_columns.append(column) %}
      {%- endif -%}
    {%- endfor -%}
  {%- endif -%}
  {#- Columns the model's SQL adds beyond bronze's (e.g. fields extracted from a MongoDB document). -#}
  {%- set extra_columns = [] -%}
  {%- for column in run_query('select * from (' ~ input_sql ~ ') where false').column_names -%}
    {%- if column not in types and not column.startswith('_change_') and column != '_commit_snapshot_id' -%}{% do extra_columns.append(column) %}{%- endif -%}
  {%- endfor -%}
  {%- set source_type = types.get('source', '') -%}
  {%- set source_ts_expr = 'timestamp_millis(source.ts_ms)' if source_type.startswith('struct') else "timestamp_millis(cast(get_json_object(source, '$.ts_ms') as bigint))" -%}
  {{ return({
      'key_columns': keys, 'key_exprs': key_exprs, 'document': document, 'image_columns': image_columns,
      'image_expr': 'after', 'extra_columns': extra_columns, 'source_ts_expr': source_ts_expr}) }}
{%- endmacro %}


{#- The bronze snapshot the lakehouse is at now (None for a table never written). -#}
{% macro bronze_snapshot(bronze) -%}
  {%- if adapter.get_relation(database=bronze.database, schema=bronze.schema, identifier=bronze.identifier) is none -%}
    {{ log("cdclake: bronze table " ~ bronze ~ " does not exist yet (no change landed)", info=true) }}
    {{ return(none) }}
  {%- endif -%}
  {%- set rows = run_query('select snapshot_id from ' ~ bronze ~ '.history where is_current_ancestor order by made_current_at desc limit 1').rows -%}
  {{ return(rows[0][0] | string if rows | length else none) }}
{%- endmacro %}


{#- One property of a silver table (None if unset): where cdclake keeps what a table has applied. -#}
{% macro silver_property(target, name) -%}
  {%- for row in run_query('show tblproperties ' ~ target).rows -%}
    {%- if row[0] == name %}{{ return(row[1]) }}{% endif -%}
  {%- endfor -%}
  {{ return(none) }}
{%- endmacro %}


{#- The bronze snapshot a silver table has applied up to, kept durably in the silver table's properties. -#}
{% macro applied_snapshot(target) -%}
  {{ return(cdclake.silver_property(target, 'cdclake.bronze_snapshot_id')) }}
{%- endmacro %}


{#-
  The bronze rows added after snapshot `start` up to `end`, as a temporary view: an incremental changelog scan,
  so a run reads only the new files. Without `start` (first run, --full-refresh, or the applied snapshot was
  expired), all of bronze as of `end`; the ordering guard makes re-reading already applied changes harmless.
-#}
{% macro changes_view(bronze, start, end) -%}
  {%- set view = model.alias ~ '__cdc_changes' -%}
  {%- if start is not none -%}
    {%- set known = run_query('select count(*) from ' ~ bronze ~ '.snapshots where snapshot_id = ' ~ start).rows[0][0] -%}
    {%- if known == 0 -%}
      {{ log("cdclake: bronze snapshot " ~ start ~ " applied by " ~ model.alias ~ " has been expired; re-reading all of " ~ bronze, info=true) }}
      {%- set start = none -%}
    {%- endif -%}
  {%- endif -%}
  {%- if start is none -%}
    {% do run_query('create or replace temporary view ' ~ view ~ ' as select * from ' ~ bronze ~ ' version as of ' ~ end) %}
  {%- else -%}
    {%- set catalog = run_query('select current_catalog()').rows[0][0] -%}
    {% do run_query("call " ~ catalog ~ ".system.create_changelog_view(table => '" ~ bronze.schema ~ "." ~ bronze.identifier ~ "', options => map('start-snapshot-id', '" ~ start ~ "', 'end-snapshot-id', '" ~ end ~ "'), changelog_view => '" ~ view ~ "__raw')") %}
    {% do run_query('create or replace temporary view ' ~ view ~ ' as select * from ' ~ view ~ "__raw where _change_type = 'INSERT'") %}
  {%- endif -%}
  {{ return(view) }}
{%- endmacro %}


{#- A key field of a schemaless (JSON text) Debezium key, as a string. -#}
{% macro json_key_expr(name) -%}
  get_json_object(key, '$.{{ name | replace("\\", "\\\\") | replace("'", "\\'") }}')
{%- endmacro %}
