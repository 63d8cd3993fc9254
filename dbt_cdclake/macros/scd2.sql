{#-
  history='scd2': silver keeps every version of each key instead of its current state.

  A row is a version: the image a change (c, u, r) gave the key, valid from that change's position until the
  key's next change (_cdc_valid_to null while current). A delete ends the key's current version; with
  delete_mode='soft' it is also a row of its own (a marker version: _cdc_deleted, image columns null), with
  delete_mode='hard' (default) it goes to <model>__cdc_tombstones (every delete, not only the last) so a late
  change before it is still closed by it. A truncate ends every version open at its position, like a delete of
  each such key, also the version of a change older than it that lands in a later unit of work (scd2_truncates).

  Each run recomputes the history of the keys the unit of work touches, from their stored rows plus the new
  changes: duplicates (an event with the same position, op and image as the key's event before it: replays)
  collapse to the copy already stored (else the first landed), late changes fall into place, and the stored rows
  that change (a closed interval, a row to drop) are replaced, staged on a branch with the new versions
  (scd2_stage). Untouched keys are not rewritten.
-#}

{#- Position of a history row (silver version or tombstone), comparable with net_effect's position(). -#}
{% macro scd2_position(alias, order='_cdc_valid_from') -%}
  named_struct('o', {{ alias }}.{{ order }}, 'r', {{ cdclake.op_rank(alias ~ '._cdc_op') }}, 'f', {{ alias }}._cdc_offset)
{%- endmacro %}


{#- Non-key data columns of a silver row (image columns, document, extracted columns). -#}
{% macro scd2_value_columns(layout) -%}
  {%- set values = [] -%}
  {%- for column in cdclake.data_columns(layout) %}{% if column not in layout.key_columns %}{% do values.append(column) %}{% endif %}{% endfor -%}
  {{ return(values) }}
{%- endmacro %}


{#-
  The truncates a history run applies: {'unit': whether the unit of work holds one, 'earlier_sql': the model's
  SQL over bronze before the unit (none: not needed), 'stored': the latest truncate applied, kept in
  `cdclake.truncated_before` as "<order,...>;<offset>" (none: there is none)}.
  A change older than a truncate that lands in a later unit of work than it must be ended by it, as in a rebuild:
  when the unit holds a change older than the latest truncate applied, the run reads bronze's truncates before
  the unit as well (through the model's SQL and `exclude_changes`, as --full-refresh does). Only then: a late
  change across a truncate is rare, and it costs a read of bronze's `op` column. One query over the unit decides
  it, and none when bronze's running counts rule a truncate out (probe=false) and none was ever applied.
-#}
{% macro scd2_truncates(bronze, sql, input_sql, start, previous, probe=true) -%}
  {%- set previous = previous or none -%}
  {%- set found = {'unit': false, 'earlier_sql': none, 'stored': previous} -%}
  {%- if not probe and previous is none %}{{ return(found) }}{% endif -%}
  {%- set latest = "max(case when op = 't' then named_struct('o', _cdc_order, 'r', 4, 'f', _cdc_offset) end)" -%}
  {%- set late = '0' -%}
  {%- if previous is not none -%}
    {%- set applied = cdclake.stored_position(previous) -%}
    {%- set latest = 'greatest(' ~ latest ~ ', ' ~ applied ~ ')' -%}
    {%- set late = "count_if(op <> 't' and named_struct('o', _cdc_order, 'r', " ~ cdclake.op_rank('op') ~ ", 'f', _cdc_offset) < " ~ applied ~ ")" -%}
  {%- endif -%}
  {%- set row = run_query("select units, late, " ~ cdclake.stored_position_text('p') ~ " from (select count_if(op = 't') as units, " ~ late ~ " as late, " ~ latest ~ " as p from (" ~ input_sql ~ ") unit_of_work)").rows[0] -%}
  {%- do found.update({'unit': row[0] > 0, 'stored': row[2]}) -%}
  {%- if row[1] > 0 and start is not none -%}
    {%- set earlier = cdclake.session_view('__cdc_earlier') -%}
    {% do run_query('create or replace temporary view ' ~ earlier ~ ' as select * from ' ~ bronze ~ ' version as of ' ~ (start | int) ~ cdclake.kept_changes_filter()) %}
    {%- do found.update({'earlier_sql': sql | replace(bronze | string, earlier)}) -%}
  {%- endif -%}
  {{ return(found) }}
{%- endmacro %}


{#-
  The events of the keys this run touches: the unit's changes (_cdc_stored 0), a truncate's end of each touched
  key's version, and the stored rows of those keys (1: a silver row, 2: a tombstone; _cdc_was_*: a stored row's
  interval). `target`: silver, none on a first build. `truncates`: as scd2_truncates returns it. `broadcast`: the
  touched keys are broadcast to the semi-joins (an incremental unit without a truncate, see the materialization),
  as the current-state batch's are, whatever Spark estimates their size to be (at 10M versions the statement took
  6.5-6.9 s with the hint and without it). Written to a table of the run (scd2_prepare) before scd2_rows_sql reads
  it: as one query, Spark planned the unit's scans and silver's three times over, one statement taking 1.4-1.6 s
  on a few rows against 0.9-1.0 for the two.
-#}
{% macro scd2_events_sql(input_sql, layout, target, tombstones, delete_mode, truncates, broadcast=false) -%}
  {{ return(adapter.dispatch('scd2_events_sql', 'cdclake')(input_sql, layout, target, tombstones, delete_mode, truncates, broadcast)) }}
{%- endmacro %}

{% macro default__scd2_events_sql(input_sql, layout, target, tombstones, delete_mode, truncates, broadcast=false) -%}
  {%- set keys = layout.key_columns -%}
  {%- set hint = '/*+ BROADCAST(k) */ ' if broadcast else '' -%}
  {%- set values = cdclake.scd2_value_columns(layout) -%}
  {%- set by_key -%}{% for key in keys %}{{ cdclake.quote(key) }}{% if not loop.last %}, {% endif %}{% endfor %}{%- endset -%}
with changes as (
  select
    {%- for key in keys %}
    {{ layout.key_exprs[key] }} as {{ cdclake.quote(key) }},
    {%- endfor %}
    {%- for column in layout.image_columns %}
    {{ layout.image_expr }}.{{ cdclake.quote(column) }} as {{ cdclake.quote(column) }},
    {%- endfor %}
    {%- if layout.document %}
    {{ layout.image_expr }} as _cdc_document,
    {%- endif %}
    {%- for column in layout.extra_columns %}
    {{ cdclake.quote(column) }},
    {%- endfor %}
    _cdc_order, op as _cdc_op, _cdc_offset, {{ layout.source_ts_expr }} as _cdc_source_ts
  from ({{ input_sql }}) bronze_input
  where op in ('c', 'u', 'd', 'r', 't')
),
unit_truncates as (
  select _cdc_order, _cdc_offset, _cdc_source_ts from changes where _cdc_op = 't'
),
truncates as (
  select * from unit_truncates
  {%- if truncates.earlier_sql %}
  union all
  {#- the unit's late changes may be older than a truncate an earlier unit held #}
  select _cdc_order, _cdc_offset, {{ layout.source_ts_expr }} from ({{ truncates.earlier_sql }}) earlier_input where op = 't'
  {%- endif %}
),
touched as (
  select distinct {{ by_key }} from changes where _cdc_op <> 't'
  {%- if truncates.unit and target is not none %}
  union
  {#- every key with a version open at a truncate of the unit: the truncate ends it #}
  select {% for key in keys %}s.{{ cdclake.quote(key) }}{% if not loop.last %}, {% endif %}{% endfor %}
  from {{ target }} s join unit_truncates t
    on {{ cdclake.scd2_position('s') }} < named_struct('o', t._cdc_order, 'r', 4, 'f', t._cdc_offset)
    and (s._cdc_valid_to is null or s._cdc_valid_to >= t._cdc_order)
  where s._cdc_op in ('c', 'u', 'r')
  {%- endif %}
),
events as (
  {#- _cdc_stored: 0 new, 1 a silver row, 2 a tombstone; _cdc_was_*: a stored row's interval -#}
  select changes.*, 0 as _cdc_stored, cast(null as array<bigint>) as _cdc_was_valid_to, cast(null as timestamp) as _cdc_was_valid_to_ts, cast(null as boolean) as _cdc_was_current
  from changes where _cdc_op <> 't'
  union all
  select {% for key in keys %}k.{{ cdclake.quote(key) }}, {% endfor %}{% for column in values %}null, {% endfor -%}
    t._cdc_order, 't', t._cdc_offset, t._cdc_source_ts, 0, null, null, null
  from touched k cross join truncates t
  {%- if target is not none %}
  union all
  select {{ hint }}{% for key in keys %}s.{{ cdclake.quote(key) }}, {% endfor %}{% for column in values %}s.{{ cdclake.quote(column) }}, {% endfor -%}
    s._cdc_valid_from, s._cdc_op, s._cdc_offset, s._cdc_valid_from_ts, 1, s._cdc_valid_to, s._cdc_valid_to_ts, s._cdc_is_current
  from {{ target }} s left semi join touched k on {{ cdclake.key_match(keys, 's', 'k') }}
  {%- if delete_mode == 'hard' %}
  union all
  select {{ hint }}{% for key in keys %}b.{{ cdclake.quote(key) }}, {% endfor %}{% for column in values %}null, {% endfor -%}
    b._cdc_order, b._cdc_op, b._cdc_offset, b._cdc_source_ts, 2, null, null, null
  from {{ tombstones }} b left semi join touched k on {{ cdclake.key_match(keys, 'b', 'k') }}
  {%- endif %}
  {%- endif %}
)
select * from events
{%- endmacro %}


{#-
  Every row the touched keys should have after this run, plus the stored rows to drop, with _cdc_target
  ('silver' | 'tombstones') and _cdc_action ('insert' | 'update' | 'delete' | null: unchanged), from `events`
  (scd2_events_sql's rows, a relation).
-#}
{% macro scd2_rows_sql(events, layout, delete_mode) -%}
  {{ return(adapter.dispatch('scd2_rows_sql', 'cdclake')(events, layout, delete_mode)) }}
{%- endmacro %}

{% macro default__scd2_rows_sql(events, layout, delete_mode) -%}
  {%- set keys = layout.key_columns -%}
  {%- set values = cdclake.scd2_value_columns(layout) -%}
  {%- set by_key -%}{% for key in keys %}{{ cdclake.quote(key) }}{% if not loop.last %}, {% endif %}{% endfor %}{%- endset -%}
  {%- set in_order = '_cdc_order, ' ~ cdclake.op_rank('_cdc_op') ~ ', _cdc_offset' -%}
  {%- set stored_first = 'case when _cdc_stored > 0 then 0 else 1 end, _cdc_offset' -%}
with copies as (
  {#- a replay: the same position, op and image as the key's event just before it (offsets differ): a version that
      changes nothing; the first of such a run stays (a stored row, as it sorts first). Not any earlier event of
      that image: A, B, A at one position (a transaction without transaction metadata) ends at A. -#}
  select *, case when lag(_cdc_identity) over (partition by {{ by_key }} order by {{ in_order }}, {{ stored_first }}) <=> _cdc_identity then 2 else 1 end as _cdc_copy
  from (
    select *, named_struct('o', _cdc_order, 'op', _cdc_op,
        'v', to_json(named_struct('v', ''{% for column in values %}, 'c{{ loop.index }}', {{ cdclake.quote(column) }}{% endfor %}))) as _cdc_identity
    from {{ events }}
  ) identified
),
records as (
  {#- the same record (offset too) read twice, e.g. a unit of work re-read after a failed run -#}
  select *, row_number() over (partition by {{ by_key }}, _cdc_order, _cdc_op, _cdc_offset order by {{ stored_first }}) as _cdc_record
  from copies where _cdc_copy = 1
),
sequenced as (
  select *, lag(_cdc_op) over (partition by {{ by_key }} order by {{ in_order }}) as _cdc_previous_op
  from records where _cdc_record = 1
),
history as (
  {#- a truncate ends a version; one that finds the key deleted already is void -#}
  select *,
    lead(_cdc_order) over w as _cdc_valid_to,
    lead(_cdc_source_ts) over w as _cdc_valid_to_ts,
    lead(_cdc_offset) over w is null as _cdc_is_current
  from sequenced
  where _cdc_op <> 't' or _cdc_previous_op in ('c', 'u', 'r')
  window w as (partition by {{ by_key }} order by {{ in_order }})
),
kept as (
  select *,
    {%- if delete_mode == 'hard' %}
    case when _cdc_op in ('d', 't') then 'tombstones' else 'silver' end as _cdc_target,
    {%- else %}
    'silver' as _cdc_target,
    {%- endif %}
    case
      when _cdc_stored = 0 then 'insert'
      when _cdc_stored = 1 and not (_cdc_was_valid_to <=> _cdc_valid_to and _cdc_was_valid_to_ts <=> _cdc_valid_to_ts
        and _cdc_was_current <=> _cdc_is_current) then 'update'
    end as _cdc_action
  from history
),
dropped as (
  select *, cast(null as array<bigint>) as _cdc_valid_to, cast(null as timestamp) as _cdc_valid_to_ts, cast(null as boolean) as _cdc_is_current,
    case _cdc_stored when 1 then 'silver' else 'tombstones' end as _cdc_target, 'delete' as _cdc_action
  from (
    select * from sequenced
    where _cdc_stored > 0 and _cdc_op = 't' and not (_cdc_previous_op <=> 'c' or _cdc_previous_op <=> 'u' or _cdc_previous_op <=> 'r')
    union all
    {#- a stored row whose replay sorts before it (a lower offset: another partition, a truncate's null Kafka key):
        the replay takes its place, as in a rebuild; left stored, the key had the version twice #}
    select *, 1 as _cdc_record, cast(null as string) as _cdc_previous_op from copies where _cdc_stored > 0 and _cdc_copy = 2
  ) void
)
select * from kept
union all
select * from dropped
{%- endmacro %}


{#- The silver columns of a history row `r`, in table order. -#}
{% macro scd2_silver_columns(layout, delete_mode) -%}
  {%- set columns = cdclake.data_columns(layout) -%}
  {%- for column in ['_cdc_op', '_cdc_offset', '_cdc_valid_from', '_cdc_valid_from_ts', '_cdc_valid_to', '_cdc_valid_to_ts', '_cdc_is_current'] %}{% do columns.append(column) %}{% endfor -%}
  {%- if delete_mode == 'soft' %}{% do columns.append('_cdc_deleted') %}{% endif -%}
  {%- do columns.append('_cdc_applied_at') -%}
  {{ return(columns) }}
{%- endmacro %}


{#- Value of silver column `column` for history row `r`. -#}
{% macro scd2_silver_value(column, alias) -%}
  {%- set derived = {
      '_cdc_valid_from': alias ~ '._cdc_order', '_cdc_valid_from_ts': alias ~ '._cdc_source_ts',
      '_cdc_deleted': alias ~ "._cdc_op in ('d', 't')", '_cdc_applied_at': 'current_timestamp()'} -%}
  {{ derived.get(column, alias ~ '.' ~ cdclake.quote(column)) }}
{%- endmacro %}


{% macro scd2_create_sql(target, layout, rows, delete_mode, replace=false) -%}
  create {% if replace %}or replace {% endif %}table {{ target }}
  using iceberg
  {{ cdclake.silver_partitioning() }}
  tblproperties ({{ cdclake.silver_table_properties() }}, 'cdclake.history' = 'scd2')
  as select
    {%- for column in cdclake.scd2_silver_columns(layout, delete_mode) %}
    {{ cdclake.scd2_silver_value(column, 'r') }} as {{ cdclake.quote(column) }}{% if not loop.last %},{% endif %}
    {%- endfor %}
  from {{ rows }} r
  where r._cdc_target = 'silver'
{%- endmacro %}


{% macro scd2_create_tombstones_sql(tombstones, layout, rows, replace=false) -%}
  create {% if replace %}or replace {% endif %}table {{ tombstones }}
  using iceberg
  tblproperties ({{ cdclake.silver_table_properties(rows=false) }}, 'cdclake.history' = 'scd2')
  as select {% for key in layout.key_columns %}r.{{ cdclake.quote(key) }}, {% endfor %}r._cdc_order, r._cdc_op, r._cdc_offset, r._cdc_source_ts,
    current_timestamp() as _cdc_deleted_at
  from {{ rows }} r
  where r._cdc_target = 'tombstones'
{%- endmacro %}


{#-
  Stages a history run's changes to silver on the run's branch of `target` (create_apply_branch: made from the
  snapshot the run's properties describe; the caller fast-forwards main to it, one atomic step, as in the
  current-state path), and returns the branch's name; none when silver does not change. The stored versions whose
  interval changes, and those that go, are deleted, and the new and changed versions inserted. Not one MERGE:
  Spark 3.5 plans a MERGE with an insert clause as a right outer join, which shuffles all of silver, and its
  updates read every column of every row (15-18 s a run over 11M versions, where the DELETE, which reads the key
  and position columns, and the INSERT took 4 s; docs/benchmark-notes.md). When silver has a column the run does not
  write (one the model no longer selects), the changed versions are updated in place instead, by a MERGE that
  only matches, so that they keep its values.
-#}
{% macro scd2_stage(target, layout, delete_mode, properties, run_id, broadcast) -%}
  {%- set rows = cdclake.scratch_table(layout, 'history') -%}
  {%- set null_key = [] -%}
  {%- for key in layout.key_columns %}{% do null_key.append(cdclake.quote(key) ~ ' is null') %}{% endfor -%}
  {#- Versions that change or go, new ones, rows with a null key part, versions that change. -#}
  {%- set counts = run_query("select count_if(_cdc_action in ('update', 'delete')), count_if(_cdc_action = 'insert'), count_if(" ~ null_key | join(' or ') ~ "), count_if(_cdc_action = 'update') from " ~ rows ~ " where _cdc_target = 'silver'").rows[0] -%}
  {%- if counts[0] == 0 and counts[1] == 0 %}{{ return(none) }}{% endif -%}
  {%- set columns = cdclake.scd2_silver_columns(layout, delete_mode) -%}
  {%- set written = columns | map('lower') | list -%}
  {%- set kept = [] -%}
  {%- for name in cdclake.describe_columns(target) if name | lower not in written %}{% do kept.append(name) %}{% endfor -%}
  {%- set branch = cdclake.create_apply_branch(target, properties, run_id) -%}
  {%- set staged = branch.relation -%}
  {%- set null_safe = counts[2] > 0 -%}
  {%- set matched -%}
    {{ cdclake.key_match(layout.key_columns, 't', 's', null_safe) }} and t._cdc_valid_from <=> s._cdc_order and t._cdc_op = s._cdc_op and t._cdc_offset <=> s._cdc_offset
  {%- endset -%}
  {%- set changed = "s._cdc_target = 'silver' and s._cdc_action in ('update', 'delete')" -%}
  {%- set hint = '/*+ BROADCAST(s) */ ' if broadcast else '' -%}
  {%- if counts[0] > 0 and kept -%}
    {% do run_query('merge into ' ~ staged ~ ' t using (select ' ~ hint ~ '* from ' ~ rows ~ ' s where ' ~ changed ~ ') s on ' ~ matched
      ~ " when matched and s._cdc_action = 'delete' then delete"
      ~ " when matched then update set t._cdc_valid_to = s._cdc_valid_to, t._cdc_valid_to_ts = s._cdc_valid_to_ts, t._cdc_is_current = s._cdc_is_current, t._cdc_applied_at = current_timestamp()") %}
  {%- elif counts[0] > 0 -%}
    {% do run_query('delete from ' ~ staged ~ ' t where exists (select ' ~ hint ~ '1 from ' ~ rows ~ ' s where ' ~ changed ~ ' and ' ~ matched ~ ')') %}
  {%- endif -%}
  {#- The DELETE took the changed versions out: they go in again with the new ones. -#}
  {%- set reinserted = counts[3] > 0 and not kept -%}
  {%- if counts[1] > 0 or reinserted -%}
    {#- (A column the run does not write is null in new versions, as a MERGE's insert leaves it.) -#}
    {% do run_query('insert into ' ~ staged ~ ' (' ~ cdclake.quoted_columns(columns + kept) ~ ') select '
      ~ cdclake.scd2_silver_values(columns, 's') ~ (', null' * kept | length) ~ ' from ' ~ rows
      ~ " s where s._cdc_target = 'silver' and s._cdc_action in ('insert'" ~ (", 'update'" if reinserted else '') ~ ")") %}
  {%- endif -%}
  {{ return(branch.name) }}
{%- endmacro %}


{#- `c1`, `c2`, ... of a list of column names. -#}
{% macro quoted_columns(columns) -%}
  {%- for column in columns %}{{ cdclake.quote(column) }}{% if not loop.last %}, {% endif %}{% endfor -%}
{%- endmacro %}


{#- The values of silver columns `columns` for history rows `alias`. -#}
{% macro scd2_silver_values(columns, alias) -%}
  {%- for column in columns %}{{ cdclake.scd2_silver_value(column, alias) }}{% if not loop.last %}, {% endif %}{% endfor -%}
{%- endmacro %}


{% macro scd2_tombstone_merge_sql(tombstones, layout, rows) -%}
  merge into {{ tombstones }} b
  using (select * from {{ rows }} where _cdc_target = 'tombstones' and _cdc_action is not null) s
  on {{ cdclake.key_match(layout.key_columns, 'b', 's') }} and b._cdc_order = s._cdc_order and b._cdc_op = s._cdc_op
    and b._cdc_offset = s._cdc_offset
  when matched and s._cdc_action = 'delete' then delete
  when not matched and s._cdc_action = 'insert' then insert
    ({% for key in layout.key_columns %}{{ cdclake.quote(key) }}, {% endfor %}_cdc_order, _cdc_op, _cdc_offset, _cdc_source_ts, _cdc_deleted_at)
    values ({% for key in layout.key_columns %}s.{{ cdclake.quote(key) }}, {% endfor %}s._cdc_order, s._cdc_op, s._cdc_offset, s._cdc_source_ts, current_timestamp())
{%- endmacro %}


{#-
  Decides one unit of work for a history='scd2' model into the run's history table and, on a first build, returns
  the SQL of its 'main' statement (the silver CREATE; later runs stage their changes with scd2_stage);
  tombstones (delete_mode='hard') are written before it on the first run, after it later, as the current-state
  path does. Call scd2_finish() after 'main'. `truncates`: scd2_truncates(). `replace`: a --full-refresh of
  existing tables, each replaced in one commit. `broadcast`: see scd2_events_sql.
-#}
{% macro scd2_prepare(input_sql, layout, target, tombstones, existing, delete_mode, truncates, replace=false, broadcast=false) -%}
  {%- set rows = cdclake.scratch_table(layout, 'history') -%}
  {#- Materialized once: the writes that follow change what a lazy view over silver would return. A table of this
      run, as the folded images are (partial_images.sql): a cached relation keeps the plan it was made from, which
      every statement reading it analyzed and printed again (seconds each, tens of seconds over folded images). -#}
  {%- set events = cdclake.scratch_table(layout, 'history_events') -%}
  {% do run_query('create table ' ~ events ~ ' using iceberg as ' ~ cdclake.scd2_events_sql(input_sql, layout, target if existing is not none else none, tombstones, delete_mode, truncates, broadcast)) %}
  {% do run_query('create table ' ~ rows ~ ' using iceberg as ' ~ cdclake.scd2_rows_sql(events, layout, delete_mode)) %}
  {% do run_query('drop table if exists ' ~ events ~ ' purge') %}
  {%- if existing is none -%}
    {%- if delete_mode == 'hard' -%}
      {%- if not replace %}{% do run_query('drop table if exists ' ~ tombstones) %}{% endif -%}
      {% do run_query(cdclake.scd2_create_tombstones_sql(tombstones, layout, rows, replace)) %}
    {%- endif -%}
    {{ return(cdclake.scd2_create_sql(target, layout, rows, delete_mode, replace)) }}
  {%- endif -%}
  {{ return(none) }}
{%- endmacro %}


{% macro scd2_finish(layout, tombstones, existing, delete_mode) -%}
  {%- set rows = cdclake.scratch_table(layout, 'history') -%}
  {%- if existing is not none and delete_mode == 'hard' -%}
    {% do run_query(cdclake.scd2_tombstone_merge_sql(tombstones, layout, rows)) %}
  {%- endif -%}
  {% do run_query('drop table if exists ' ~ rows ~ ' purge') %}
{%- endmacro %}

