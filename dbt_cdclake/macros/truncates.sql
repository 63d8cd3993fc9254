{#- Truncates (op 't'): which one a run applies, what it leaves, and when a model refuses one. -#}


{#-
  The latest truncate that applies to this run: the newest `op t` of the unit of work, or the one a previous run
  applied (stored in the silver table's properties as "<order,...>;<offset>"), whichever is newer. Returns none,
  or {literal: a position to compare with, stored: its property text, new: whether this unit of work moved it}.
  `probe`: false when the unit is known to hold no truncate (truncate_free): the unit is not read for one.
-#}
{% macro truncate_position(input_sql, previous, probe=true) -%}
  {%- set stored = previous or none -%}
  {%- if probe -%}
    {%- set candidates = ["(select max(named_struct('o', _cdc_order, 'r', 4, 'f', _cdc_offset)) from (" ~ input_sql ~ ") where op = 't')"] -%}
    {%- if previous -%}{% do candidates.append(cdclake.stored_position(previous)) %}{%- endif -%}
    {%- set row = run_query("select " ~ cdclake.stored_position_text('p') ~ " from (select " ~ ("greatest(" ~ candidates | join(', ') ~ ")" if candidates | length > 1 else candidates[0]) ~ " as p) where p is not null").rows -%}
    {%- set stored = row[0][0] if row else none -%}
  {%- endif -%}
  {%- if stored is none -%}{{ return(none) }}{%- endif -%}
  {{ return({'literal': cdclake.stored_position(stored), 'stored': stored, 'new': stored != previous}) }}
{%- endmacro %}


{#-
  A truncate ends every row of silver older than it, whichever topic the row came from. A model whose changes come
  from several topics (a bronze table several topics are mapped to by `ingest.table_mapping`: the partitions of a
  PostgreSQL partitioned table, whose TRUNCATE of one partition would empty them all, or several sources) stops
  instead, naming the topics and the ways out. Read only when the unit of work holds a truncate new to silver: the
  topics of the model's rows over all of bronze (of bronze's, should the model's SQL leave `_cdc_topic` out).
-#}
{% macro refuse_truncate_across_topics(bronze, sql, input_sql, end, target) -%}
  {%- set history = cdclake.session_view('__cdc_topics') -%}
  {% do run_query('create or replace temporary view ' ~ history ~ ' as select * from ' ~ bronze ~ ' version as of ' ~ (end | int) ~ cdclake.kept_changes_filter()) %}
  {%- set model_sql = sql | replace(bronze | string, history) -%}
  {%- set whole_bronze = '_cdc_topic' not in run_query('select * from (' ~ model_sql ~ ') where false').column_names -%}
  {%- if whole_bronze -%}
    {%- set model_sql, input_sql = 'select * from ' ~ history, 'select * from ' ~ history -%}
  {%- endif -%}
  {%- set row = run_query("select size(t), concat_ws(', ', t), (select concat_ws(', ', sort_array(collect_set(_cdc_topic))) from (" ~ input_sql ~ ") where op = 't') from (select sort_array(collect_set(_cdc_topic)) as t from (" ~ model_sql ~ "))").rows[0] -%}
  {%- if row[0] > 1 -%}
    {{ exceptions.raise_compiler_error("cdc_silver model '" ~ model.name ~ "': its changes come from " ~ row[0] ~ " topics (" ~ row[1] ~ (", those of all of " ~ bronze ~ ": the model does not select _cdc_topic, which a model of one topic must" if whole_bronze else "") ~ "), and a truncate from " ~ row[2] ~ " would end every row of " ~ target ~ " older than it, the other topics' included (a TRUNCATE of one partition of a PostgreSQL partitioned table would empty every partition's rows). Give each topic a model of its own (where _cdc_topic = '...') and union them downstream, or leave truncates out of this model (exclude_changes=\"op = 't'\"), which keeps the rows they truncated.") }}
  {%- endif -%}
{%- endmacro %}


{#- The changes of `input_sql` a truncate (`truncate_position`: this unit's or the latest applied one) leaves: an
    older one is void, as a key's winner and as the change whose values a soft-deleted row keeps. -#}
{% macro after_truncate_sql(input_sql, truncate) -%}
  {%- if truncate is none -%}
  {{ input_sql }}
  {%- else -%}
  select * from ({{ input_sql }}) i
  where {{ cdclake.change_position('i') }} > {{ truncate.literal }}
  {%- endif -%}
{%- endmacro %}


{#- With soft deletes, a new truncate also voids the values that rows soft-deleted after it kept from changes
    before it (a truncate landing late, or in the delete's unit): they keep none, as --full-refresh gives. Rows whose
    values are of an unknown change (null _cdc_values_position) keep them. -#}
{% macro void_kept_values_sql(layout, relation, truncate) -%}
  update {{ relation }} set
  {%- for column in cdclake.data_columns(layout) if column not in layout.key_columns %} {{ cdclake.quote(column) }} = null,{% endfor %}
    _cdc_values_position = {{ cdclake.no_values_position() }}
  where _cdc_op = 'd' and _cdc_values_position < {{ truncate.literal }} and _cdc_values_position > {{ cdclake.no_values_position() }}
{%- endmacro %}
