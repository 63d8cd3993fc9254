{#-
  materialized='cdc_silver': a current-state table of one bronze table, maintained by net-effect apply (or, with
  history='scd2', the table's version history: see scd2.sql).

  The model's SQL selects from one bronze source (usually `select * from {{ source('bronze', 't') }}`; a where
  clause or extracted columns are fine). Each run applies the bronze snapshots added since the last run in ONE
  MERGE (one Iceberg commit: readers see the old state or the new one), guarded so that a change not newer than
  what silver holds for its key is ignored. Deleted keys keep a tombstone (key + position) so a late, older change
  cannot bring them back: in `<model>__cdc_tombstones` (delete_mode='hard', default) or as the row itself with
  _cdc_deleted = true (delete_mode='soft').

  Options: keys, delete_mode ('hard'|'soft'), columns / exclude_columns (image columns kept),
  ignore_null_updates (partial images: a null in an update keeps the key's previous value), tombstone_horizon_days,
  history ('current', default | 'scd2': one row per version of each key, see scd2.sql).

  Partial images (ignore_null_updates; MongoDB updates without a full document) are folded onto the key's previous
  image before net effect (partial_images.sql), so every path below sees full images.
-#}
{% materialization cdc_silver, adapter='spark' %}
  {%- set identifier = model['alias'] -%}
  {%- set target = api.Relation.create(identifier=identifier, schema=schema, database=database, type='table') -%}
  {%- set tombstones = api.Relation.create(identifier=identifier ~ '__cdc_tombstones', schema=schema, database=database, type='table') -%}
  {%- set existing = adapter.get_relation(database=database, schema=schema, identifier=identifier) -%}
  {%- set delete_mode = config.get('delete_mode', 'hard') -%}
  {%- if delete_mode not in ['hard', 'soft'] -%}
    {{ exceptions.raise_compiler_error("cdc_silver model '" ~ model.name ~ "': delete_mode must be 'hard' or 'soft', not '" ~ delete_mode ~ "'") }}
  {%- endif -%}
  {%- set history = config.get('history', 'current') -%}
  {%- if history not in ['current', 'scd2'] -%}
    {{ exceptions.raise_compiler_error("cdc_silver model '" ~ model.name ~ "': history must be 'current' or 'scd2', not '" ~ history ~ "'") }}
  {%- elif history == 'scd2' and config.get('tombstone_horizon_days') is not none -%}
    {{ exceptions.raise_compiler_error("cdc_silver model '" ~ model.name ~ "': tombstone_horizon_days does not apply to history='scd2' (deletes are part of the history)") }}
  {%- endif -%}
  {%- set bronze = cdclake.bronze_relation() -%}

  {{ run_hooks(pre_hooks) }}
  {% do run_query('create namespace if not exists ' ~ schema) %}

  {%- if existing is not none and should_full_refresh() -%}
    {% do run_query('drop table if exists ' ~ target) %}
    {% do run_query('drop table if exists ' ~ tombstones) %}
    {%- set existing = none -%}
  {%- endif -%}
  {%- if existing is not none and cdclake.table_history(target) != history -%}
    {{ exceptions.raise_compiler_error("cdc_silver model '" ~ model.name ~ "': " ~ target ~ " was built with history='" ~ cdclake.table_history(target) ~ "', the model now says '" ~ history ~ "': rebuild it with --full-refresh") }}
  {%- endif -%}

  {%- set end = cdclake.bronze_snapshot(bronze) -%}
  {%- set start = cdclake.applied_snapshot(target) if existing is not none else none -%}

  {%- if end is none or (start is not none and start == end) -%}
    {{ log("cdclake: " ~ identifier ~ " is up to date with " ~ bronze, info=true) }}
    {%- call statement('main') -%} select 1 {%- endcall -%}
  {%- elif history == 'scd2' -%}
    {%- set changes = cdclake.changes_view(bronze, start, end) -%}
    {%- set layout = cdclake.silver_layout(bronze, sql | replace(bronze | string, changes)) -%}
    {%- set changes = cdclake.fold_partial_images(bronze, changes, layout, target if existing is not none else none, tombstones, delete_mode, history) -%}
    {%- set main_sql = cdclake.scd2_prepare(sql | replace(bronze | string, changes), layout, target, tombstones, existing, delete_mode) -%}
    {%- call statement('main') -%} {{ main_sql }} {%- endcall -%}
    {% do cdclake.scd2_finish(layout, tombstones, existing, delete_mode) %}
    {% do cdclake.drop_folded_images(changes) %}
    {% do run_query("alter table " ~ target ~ " set tblproperties ('cdclake.bronze_snapshot_id' = '" ~ end ~ "')") %}
  {%- else -%}
    {%- set changes = cdclake.changes_view(bronze, start, end) -%}
    {%- set layout = cdclake.silver_layout(bronze, sql | replace(bronze | string, changes)) -%}
    {%- set changes = cdclake.fold_partial_images(bronze, changes, layout, target if existing is not none else none, tombstones, delete_mode, history) -%}
    {%- set input_sql = sql | replace(bronze | string, changes) -%}
    {%- set winners = identifier ~ '__cdc_winners' -%}
    {% do run_query('create or replace temporary view ' ~ winners ~ ' as ' ~ cdclake.net_effect_sql(input_sql, layout)) %}
    {#- A truncate (op t) removes every row older than it; changes older than it are void, in this unit of work
        and in every later one (a late change from before a truncate must not bring its row back). -#}
    {%- set previous = cdclake.silver_property(target, 'cdclake.truncated_before') if existing is not none else none -%}
    {%- set truncate = cdclake.truncate_position(input_sql, previous) -%}
    {%- set after_truncate = "true" if truncate is none else (cdclake.position('w') ~ ' > ' ~ truncate.literal) -%}

    {%- if existing is none -%}
      {#- Tombstones before silver: a run killed between the two commits finds no silver table and starts over;
          the other order left a silver table without tombstones, on which every later run failed. -#}
      {%- if delete_mode == 'hard' -%}
        {% do run_query('drop table if exists ' ~ tombstones) %}
        {% do run_query(cdclake.create_tombstones_sql(tombstones, layout, winners, after_truncate)) %}
      {%- endif -%}
      {%- call statement('main') -%}
        create table {{ target }}
        using iceberg
        tblproperties ({{ cdclake.silver_table_properties() }})
        as select {{ cdclake.silver_select(layout, 'w') }}
          {%- if delete_mode == 'soft' %}, w._cdc_op = 'd' as _cdc_deleted, case when w._cdc_op = 'd' then current_timestamp() end as _cdc_deleted_at{% endif %}
        from {{ winners }} w
        where {{ after_truncate }} {% if delete_mode == 'hard' %}and w._cdc_op <> 'd'{% endif %}
      {%- endcall -%}
    {%- else -%}
      {%- set applicable = identifier ~ '__cdc_applicable' -%}
      {% do run_query('uncache table if exists ' ~ applicable) %}
      {% do run_query('drop view if exists ' ~ applicable) %}
      {#- Materialized once: the merges below change what a lazy view over silver would return. -#}
      {% do run_query('cache table ' ~ applicable ~ ' as ' ~ cdclake.applicable_sql(layout, winners, target, tombstones, delete_mode, after_truncate)) %}
      {%- call statement('main') -%}
        {{ cdclake.silver_merge_sql(layout, applicable, target, delete_mode, truncate if truncate and truncate.new else none) }}
      {%- endcall -%}
      {%- if delete_mode == 'hard' -%}
        {% do run_query(cdclake.tombstone_merge_sql(layout, applicable, tombstones)) %}
      {%- endif -%}
      {% do run_query('uncache table if exists ' ~ applicable) %}
      {% do run_query('drop view if exists ' ~ applicable) %}
    {%- endif -%}
    {% do cdclake.drop_folded_images(changes) %}
    {% do run_query("alter table " ~ target ~ " set tblproperties ('cdclake.bronze_snapshot_id' = '" ~ end ~ "'" ~ (", 'cdclake.truncated_before' = '" ~ truncate.stored ~ "'" if truncate else "") ~ ")") %}
    {%- set horizon = config.get('tombstone_horizon_days') -%}
    {%- if horizon is not none and delete_mode == 'hard' -%}
      {% do run_query('delete from ' ~ tombstones ~ ' where _cdc_deleted_at < current_timestamp() - interval ' ~ (horizon | int) ~ ' days') %}
    {%- elif horizon is not none -%}
      {% do run_query('delete from ' ~ target ~ ' where _cdc_deleted and _cdc_deleted_at < current_timestamp() - interval ' ~ (horizon | int) ~ ' days') %}
    {%- endif -%}
  {%- endif -%}

  {{ run_hooks(post_hooks) }}
  {% do persist_docs(target, model) %}
  {{ return({'relations': [target]}) }}
{% endmaterialization %}


{% macro silver_table_properties() -%}
  'format-version' = '2',
  'write.delete.mode' = 'merge-on-read',
  'write.update.mode' = 'merge-on-read',
  'write.merge.mode' = 'merge-on-read',
  'write.parquet.compression-codec' = 'zstd'
{%- endmacro %}


{% macro create_tombstones_sql(tombstones, layout, winners, after_truncate) -%}
  create table {{ tombstones }}
  using iceberg
  tblproperties ({{ cdclake.silver_table_properties() }})
  as select {% for key in layout.key_columns %}w.{{ cdclake.quote(key) }}, {% endfor %}w._cdc_order, w._cdc_op, w._cdc_offset,
    current_timestamp() as _cdc_deleted_at
  from {{ winners }} w
  where w._cdc_op = 'd' and {{ after_truncate }}
{%- endmacro %}


{#-
  Winners shaped as silver rows, minus those not newer than their key's tombstone. Whether a winner is newer
  than the silver row is decided inside the MERGE itself, so silver is scanned once per run.
-#}
{% macro applicable_sql(layout, winners, target, tombstones, delete_mode, after_truncate) -%}
  select {{ cdclake.silver_select(layout, 'w') }}
  from {{ winners }} w
  {%- if delete_mode == 'hard' %}
  left join {{ tombstones }} b on {{ cdclake.key_match(layout.key_columns, 'b', 'w') }}
  {%- endif %}
  where {{ after_truncate }}
  {%- if delete_mode == 'hard' %}
    and (b._cdc_op is null or {{ cdclake.position('w') }} > {{ cdclake.position('b') }})
  {%- endif %}
{%- endmacro %}


{#-
  The latest truncate that applies to this run: the newest `op t` of the unit of work, or the one a previous run
  applied (stored in the silver table's properties as "<order,...>;<offset>"), whichever is newer. Returns none,
  or {literal: a position to compare with, stored: its property text, new: whether this unit of work moved it}.
-#}
{% macro truncate_position(input_sql, previous) -%}
  {%- set candidates = ["(select max(named_struct('o', _cdc_order, 'r', 4, 'f', _cdc_offset)) from (" ~ input_sql ~ ") where op = 't')"] -%}
  {%- if previous -%}{% do candidates.append(cdclake.stored_position(previous)) %}{%- endif -%}
  {%- set row = run_query("select concat_ws(',', transform(p.o, x -> cast(x as string))), p.f from (select " ~ ("greatest(" ~ candidates | join(', ') ~ ")" if candidates | length > 1 else candidates[0]) ~ " as p) where p is not null").rows -%}
  {%- if not row -%}{{ return(none) }}{%- endif -%}
  {%- set stored = row[0][0] ~ ';' ~ row[0][1] -%}
  {{ return({'literal': cdclake.stored_position(stored), 'stored': stored, 'new': stored != previous}) }}
{%- endmacro %}


{#- "<order,...>;<offset>" as a position literal (each part must be an integer: the text comes from a property). -#}
{% macro stored_position(text) -%}
  {%- set order, offset = text.split(';') -%}
  {%- set parts = [] -%}
  {%- for part in order.split(',') if part != '' %}{% do parts.append('cast(' ~ (part | int) ~ ' as bigint)') %}{% endfor -%}
  named_struct('o', array({{ parts | join(', ') }}), 'r', 4, 'f', cast({{ offset | int }} as bigint))
{%- endmacro %}


{% macro silver_merge_sql(layout, applicable, target, delete_mode, truncate=none) -%}
  {%- set columns = cdclake.data_columns(layout) -%}
  merge into {{ target }} t
  using {{ applicable }} s
  on {{ cdclake.key_match(layout.key_columns, 't', 's') }}
  {%- set newer = cdclake.position('s') ~ ' > ' ~ cdclake.position('t') %}
  {%- if delete_mode == 'hard' %}
  when matched and {{ newer }} and s._cdc_op = 'd' then delete
  {%- else %}
  when matched and {{ newer }} and s._cdc_op = 'd' then update set
    t._cdc_deleted = true, t._cdc_deleted_at = current_timestamp(), t._cdc_order = s._cdc_order,
    t._cdc_op = s._cdc_op, t._cdc_offset = s._cdc_offset, t._cdc_source_ts = s._cdc_source_ts, t._cdc_applied_at = s._cdc_applied_at
  {%- endif %}
  when matched and {{ newer }} then update set
    {%- for column in columns %}
    t.{{ cdclake.quote(column) }} = s.{{ cdclake.quote(column) }},
    {%- endfor %}
    {%- if delete_mode == 'soft' %}
    t._cdc_deleted = false, t._cdc_deleted_at = null,
    {%- endif %}
    t._cdc_order = s._cdc_order, t._cdc_op = s._cdc_op, t._cdc_offset = s._cdc_offset,
    t._cdc_source_ts = s._cdc_source_ts, t._cdc_applied_at = s._cdc_applied_at
  {%- if delete_mode == 'hard' %}
  when not matched and s._cdc_op <> 'd' then insert
  {%- else %}
  when not matched then insert
  {%- endif %}
    ({% for column in columns %}{{ cdclake.quote(column) }}, {% endfor %}_cdc_order, _cdc_op, _cdc_offset, _cdc_source_ts, _cdc_applied_at{% if delete_mode == 'soft' %}, _cdc_deleted, _cdc_deleted_at{% endif %})
    values ({% for column in columns %}s.{{ cdclake.quote(column) }}, {% endfor %}s._cdc_order, s._cdc_op, s._cdc_offset, s._cdc_source_ts, s._cdc_applied_at{% if delete_mode == 'soft' %}, s._cdc_op = 'd', case when s._cdc_op = 'd' then current_timestamp() end{% endif %})
  {%- if truncate is not none %}
  {#- In the same commit as the changes: readers never see the truncate without what follows it. -#}
  when not matched by source and {{ cdclake.position('t') }} < {{ truncate.literal }} then delete
  {%- endif %}
{%- endmacro %}


{#-
  Deletes become tombstones; newer upserts retire them. A tombstone older than its key's silver row (a late
  delete) is harmless: any change that passes the silver row's guard is newer than it too.
-#}
{% macro tombstone_merge_sql(layout, applicable, tombstones) -%}
  merge into {{ tombstones }} b
  using {{ applicable }} s
  on {{ cdclake.key_match(layout.key_columns, 'b', 's') }}
  when matched and s._cdc_op = 'd' then update set
    b._cdc_order = s._cdc_order, b._cdc_op = s._cdc_op, b._cdc_offset = s._cdc_offset, b._cdc_deleted_at = current_timestamp()
  when matched then delete
  when not matched and s._cdc_op = 'd' then insert
    ({% for key in layout.key_columns %}{{ cdclake.quote(key) }}, {% endfor %}_cdc_order, _cdc_op, _cdc_offset, _cdc_deleted_at)
    values ({% for key in layout.key_columns %}s.{{ cdclake.quote(key) }}, {% endfor %}s._cdc_order, s._cdc_op, s._cdc_offset, current_timestamp())
{%- endmacro %}
