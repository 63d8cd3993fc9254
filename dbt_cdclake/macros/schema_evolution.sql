{#- Columns the source added reach silver (on_schema_change). -#}


{#-
  Schema changes (docs/silver.md, "Schema changes"). When the source adds a column, `cdclake ingest` adds it to
  bronze's images, and the layout names it; silver (a history table too) does not have it yet. Per dbt's
  `on_schema_change` (cdc_silver's default: 'append_new_columns', as Debezium's JDBC sink does; 'sync_all_columns'
  is the same, since bronze never drops a column): silver gets the data columns it lacks (its rows hold NULL
  there) and its columns whose type bronze widened are widened (int -> bigint, float -> double, decimal
  precision); 'fail' stops the run naming them; 'ignore' leaves silver as it is and applies only the columns it
  has. Called before anything of the run is written, and compares with silver as it is: a retried run finds the
  columns a failed one added. Returns the layout to apply.
-#}
{% macro evolve_silver_schema(target, tombstones, layout, input_sql, delete_mode, properties) -%}
  {#- dbt gives every model on_schema_change='ignore' unless set: what the model (or project) says is what counts. -#}
  {%- set mode = config.get('on_schema_change') if 'on_schema_change' in cdclake.set_options() else 'append_new_columns' -%}
  {#- Nothing changed since a run that found silver matching the layout (the usual case): no query at all. -#}
  {%- if properties.get('cdclake.layout_signature') == layout.signature -%}{{ return(layout) }}{%- endif -%}
  {%- set held = {} -%}
  {%- for name in cdclake.describe_columns(target) %}{% do held.update({name | lower: name}) %}{% endfor -%}
  {#- cdclake's own columns that a table built by an earlier version lacks (its rows hold NULL there: unknown). -#}
  {%- if delete_mode == 'soft' and config.get('history', 'current') == 'current' and '_cdc_values_position' not in held -%}
    {% do run_query('alter table ' ~ target ~ ' add columns (_cdc_values_position ' ~ cdclake.values_position_type() ~ ')') %}
  {%- endif -%}
  {%- set columns = cdclake.data_columns(layout) -%}
  {%- set missing_keys = [] -%}
  {%- for key in layout.key_columns if key | lower not in held %}{% do missing_keys.append(key) %}{% endfor -%}
  {%- if missing_keys -%}
    {{ exceptions.raise_compiler_error("cdc_silver model '" ~ model.name ~ "': key column(s) " ~ missing_keys | join(', ') ~ " are not in " ~ target ~ " (its keys changed): rebuild it with --full-refresh") }}
  {%- endif -%}
  {#- The types of the layout's columns and of silver's: typeof() over a one-row outer join that reads nothing
      (Spark's DDL spelling of each type, never truncated as describe's may be). -#}
  {%- set shared = [] -%}
  {%- for column in columns if column | lower in held %}{% do shared.append(column) %}{% endfor -%}
  {%- set columns_sql -%}
    select {% for key in layout.key_columns %}{{ layout.key_exprs[key] }} as {{ cdclake.quote(key) }}, {% endfor -%}
      {%- for column in layout.image_columns %}{{ layout.image_expr }}.{{ cdclake.quote(column) }} as {{ cdclake.quote(column) }}, {% endfor -%}
      {%- if layout.document %}{{ layout.image_expr }} as _cdc_document, {% endif -%}
      {%- for column in layout.extra_columns %}{{ cdclake.quote(column) }}, {% endfor %}1 as _cdc_one
    from ({{ input_sql }}) bronze_input
  {%- endset -%}
  {%- set types_sql -%}
    select {% for column in columns %}typeof(i.{{ cdclake.quote(column) }}), {% endfor -%}
      {%- for column in shared %}typeof(t.{{ cdclake.quote(held[column | lower]) }}), {% endfor %}1
    from (select 1) o
    left join ({{ columns_sql }}) i on false
    left join {{ target }} t on false
  {%- endset -%}
  {%- set row = run_query(types_sql).rows[0] -%}
  {%- set added = [] -%}
  {%- set widened = [] -%}
  {%- set changed = [] -%}
  {%- for column in columns -%}
    {%- set new_type = row[loop.index0] -%}
    {%- if column | lower not in held -%}
      {% do added.append({'name': column, 'type': new_type}) %}
    {%- else -%}
      {%- set old_type = row[columns | length + shared.index(column)] -%}
      {%- if new_type != old_type and cdclake.widens(old_type, new_type) -%}
        {% do widened.append({'name': held[column | lower], 'type': new_type, 'was': old_type, 'key': column in layout.key_columns}) %}
      {%- elif new_type != old_type and not cdclake.widens(new_type, old_type) -%}
        {% do changed.append(column ~ ' (' ~ old_type ~ ' in silver, ' ~ new_type ~ ' in bronze)') %}
      {%- endif -%}
    {%- endif -%}
  {%- endfor -%}
  {%- if mode == 'ignore' -%}
    {#- Silver keeps its columns: only those are applied (types it has not widened are cast on insert). -#}
    {%- set narrowed = {} -%}
    {% do narrowed.update(layout) %}
    {% do narrowed.update({'image_columns': [], 'extra_columns': []}) %}
    {%- for column in layout.image_columns if column | lower in held %}{% do narrowed.image_columns.append(column) %}{% endfor -%}
    {%- for column in layout.extra_columns if column | lower in held %}{% do narrowed.extra_columns.append(column) %}{% endfor -%}
    {#- Left out columns are looked for again next run (the signature is kept only for a layout silver matches). -#}
    {%- if added or widened %}{% do narrowed.update({'signature': none}) %}{% endif -%}
    {{ return(narrowed) }}
  {%- endif -%}
  {%- if changed -%}
    {{ exceptions.raise_compiler_error("cdc_silver model '" ~ model.name ~ "': the type of column(s) " ~ changed | join(', ') ~ " changed in a way " ~ target ~ " cannot follow (cdc_silver widens int to bigint, float to double and decimal precision): rebuild it with --full-refresh") }}
  {%- endif -%}
  {%- if mode == 'fail' and (added or widened) -%}
    {%- set changes = [] -%}
    {%- if added %}{% do changes.append('new column(s) ' ~ added | map(attribute='name') | join(', ')) %}{% endif -%}
    {%- if widened %}{% do changes.append('widened column(s) ' ~ widened | map(attribute='name') | join(', ')) %}{% endif -%}
    {{ exceptions.raise_compiler_error("cdc_silver model '" ~ model.name ~ "': on_schema_change is 'fail' and the model's columns differ from " ~ target ~ ": " ~ changes | join('; ') ~ " (set on_schema_change='append_new_columns' to add them, or rebuild with --full-refresh)") }}
  {%- endif -%}
  {%- if added -%}
    {{ log("cdclake: adding column(s) " ~ added | map(attribute='name') | join(', ') ~ " to " ~ target ~ " (new in " ~ model.alias ~ "'s bronze images; existing rows hold NULL)", info=true) }}
    {#- A nested type in DDL (ddl_types); typeof()'s spelling of the others is DDL already. -#}
    {%- set nested = [] -%}
    {%- for column in added if '<' in column.type %}{% do nested.append(column) %}{% endfor -%}
    {%- if nested -%}
      {%- set ddl = cdclake.ddl_types(columns_sql, nested | map(attribute='name') | list, layout) -%}
      {%- for column in nested %}{% do column.update({'type': ddl[loop.index0]}) %}{% endfor -%}
    {%- endif -%}
    {% do run_query('alter table ' ~ target ~ ' add columns (' ~ cdclake.column_definitions(added) ~ ')') %}
  {%- endif -%}
  {%- for column in widened -%}
    {{ log("cdclake: widening column " ~ column.name ~ " of " ~ target ~ " from " ~ column.was ~ " to " ~ column.type, info=true) }}
    {% do run_query('alter table ' ~ target ~ ' alter column ' ~ cdclake.quote(column.name) ~ ' type ' ~ column.type) %}
    {#- A key column is in the tombstones too (an existing history table's hard deletes as well). -#}
    {%- if column.key and delete_mode == 'hard' -%}
      {% do run_query('alter table ' ~ tombstones ~ ' alter column ' ~ cdclake.quote(column.name) ~ ' type ' ~ column.type) %}
    {%- endif -%}
  {%- endfor -%}
  {{ return(layout) }}
{%- endmacro %}


{#- `name type, ...` for alter table ... add columns. -#}
{% macro column_definitions(columns) -%}
  {%- for column in columns %}{{ cdclake.quote(column.name) }} {{ column.type }}{% if not loop.last %}, {% endif %}{% endfor -%}
{%- endmacro %}


{#- The types of columns `names` of query `columns_sql`, in order, as Spark's DDL spells them. typeof() leaves the
    names of struct fields bare (struct<street name:string>), which `alter table ... add columns` cannot parse, and
    which cannot be told from the type around them when they hold one of `:,<>()`. Spark's DDL quotes them
    (STRUCT<`street name`: STRING>): read from SHOW CREATE TABLE of an empty table of the run. -#}
{% macro ddl_types(columns_sql, names, layout) -%}
  {%- set scratch = cdclake.scratch_table(layout, 'types') -%}
  {%- set columns = [] -%}
  {%- for name in names %}{% do columns.append(cdclake.quote(name) ~ ' as _cdc_t' ~ loop.index0) %}{% endfor -%}
  {% do run_query('create or replace table ' ~ scratch ~ ' using iceberg as select ' ~ columns | join(', ') ~ ' from (' ~ columns_sql ~ ') where false') %}
  {%- set ddl = run_query('show create table ' ~ scratch).rows[0][0] -%}
  {% do run_query('drop table if exists ' ~ scratch ~ ' purge') %}
  {#- A line per column, `  _cdc_t<i> <type>` and a comma, or for the last the `)` that closes the list. (No `NOT
      NULL`: the columns of an Iceberg table created from a query are optional, whatever its expressions are.) -#}
  {%- set types = [] -%}
  {%- for line in ddl.split('\n') if line.startswith('  _cdc_t') %}{% do types.append(line.split(' ', 3)[3][:-1]) %}{% endfor -%}
  {%- if types | length != names | length -%}
    {{ exceptions.raise_compiler_error("cdclake: could not read the types of " ~ names | join(', ') ~ " from: " ~ ddl) }}
  {%- endif -%}
  {{ return(types) }}
{%- endmacro %}


{#- Whether Iceberg can promote a column of type `old` to `new` (Spark's DDL spelling): int to bigint, float to
    double, a decimal's precision up at the same scale. Iceberg has no tinyint or smallint (it stores them as int),
    so a model's tinyint or smallint column fits silver's int or bigint. -#}
{% macro widens(old, new) -%}
  {%- set promotions = [('int', 'bigint'), ('float', 'double'), ('tinyint', 'smallint'), ('tinyint', 'int'),
                        ('tinyint', 'bigint'), ('smallint', 'int'), ('smallint', 'bigint')] -%}
  {%- if (old, new) in promotions %}{{ return(true) }}{% endif -%}
  {%- set decimal = modules.re.compile('^decimal\\((\\d+),(\\d+)\\)$') -%}
  {%- set a = decimal.match(old) -%}
  {%- set b = decimal.match(new) -%}
  {{ return(a is not none and b is not none and a.group(2) == b.group(2) and b.group(1) | int > a.group(1) | int) }}
{%- endmacro %}
