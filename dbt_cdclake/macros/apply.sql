{#- A unit of work's apply: the batch of rows silver must hold, its counts, and the statements that change silver and its tombstones. -#}


{#- Past the tombstone horizon (tombstone_horizon_days): tombstones (hard deletes), or soft-deleted rows, leave.
    Looked for first: Iceberg commits a DELETE that matches nothing as a snapshot of its own, every run. -#}
{% macro purge_past_horizon(target, tombstones, delete_mode, horizon) -%}
  {%- set relation = tombstones if delete_mode == 'hard' else target -%}
  {%- set past = cdclake.past_horizon_sql(horizon, soft=delete_mode != 'hard') -%}
  {%- if run_query("select 1 from " ~ relation ~ " where " ~ past ~ " limit 1").rows | length > 0 -%}
    {% do run_query("delete from " ~ relation ~ " where " ~ past) %}
  {%- endif -%}
{%- endmacro %}


{#- Soft-deleted rows past the tombstone horizon (tombstone_horizon_days) leave silver. -#}
{% macro soft_delete_purge_sql(relation, horizon) -%}
  delete from {{ relation }} where {{ cdclake.past_horizon_sql(horizon, soft=true) }}
{%- endmacro %}


{% macro past_horizon_sql(horizon, soft) -%}
  {% if soft %}_cdc_deleted and {% endif %}_cdc_deleted_at < current_timestamp() - interval {{ horizon | int }} days
{%- endmacro %}


{% macro create_tombstones_sql(tombstones, layout, winners, replace=false) -%}
  create {% if replace %}or replace {% endif %}table {{ tombstones }}
  using iceberg
  tblproperties ({{ cdclake.silver_table_properties(rows=false) }})
  as select {% for key in layout.key_columns %}w.{{ cdclake.quote(key) }}, {% endfor %}w._cdc_order, w._cdc_op, w._cdc_offset,
    current_timestamp() as _cdc_deleted_at
  from {{ winners }} w
  where w._cdc_op = 'd'
{%- endmacro %}


{#-
  The unit of work, decided: per touched key the row silver must hold (for a delete in hard mode, the key and its
  position), left out when not newer than its key's silver row or tombstone, or not newer than the latest truncate.
  A delete at its own tombstone's position is kept: applying it again is idempotent, and two overlapping first
  builds can leave the tombstones of a longer bronze range than silver's, whose deletes silver still needs.
  Silver and tombstones are read only for the touched keys (left semi-joins, broadcast in an incremental run);
  the tombstones one row per key: two overlapping runs of the model that apply the same delete can both add its
  tombstone, and a joined duplicate would duplicate the key's batch row (a second silver row, a failed MERGE).
  One read of the tombstones serves the guard and `_cdc_has_tombstone` (a second, for the guard of keys with
  changes at or below `applied_position` only, took 0.1 s of a 1.3 s batch of 100k changes). For a key whose
  changes are all above `applied_position` the guard passes as it did with that second read: a tombstone newer
  than `applied_position` is one whose delete the unit holds again (left by a run killed before it recorded its
  position, by a --full-refresh killed between its two replaces, or by an overlapping first build), and the key's
  winner is at least that delete. Unless that delete now waits behind a held transaction (complete_transactions):
  an older change of its key is then ignored, as not newer than what silver applied for the key. Silver's
  positions are read only for keys with changes at or below `applied_position` (none, usually: adaptive execution
  then skips the scan, after planning it and reading the unit again for its keys, 0.1-0.3 s at 10M rows; when
  bronze's order counts show there are none, `layout.unit_after_applied`, hard deletes leave silver out of the
  query); silver's other columns only for soft deletes, which keep the values of the key's latest
  change before the delete: the unit's, or silver's row when the unit has none newer than it (a late change).
  A table, not a cached view: the statements after it change silver and the tombstones, which a view over them
  would follow, and its size is known when the DELETE broadcasts it. `broadcast`: the input is one incremental
  unit (not a re-read of all of bronze) of at most broadcast_max_changes bronze rows.
-#}
{% macro batch_sql(batch, layout, input_sql, target, tombstones, delete_mode, applied_position, truncate, broadcast) -%}
  {{ return(adapter.dispatch('batch_sql', 'cdclake')(batch, layout, input_sql, target, tombstones, delete_mode, applied_position, truncate, broadcast)) }}
{%- endmacro %}


{% macro default__batch_sql(batch, layout, input_sql, target, tombstones, delete_mode, applied_position, truncate, broadcast) -%}
  {%- set keys = layout.key_columns -%}
  {%- set columns = cdclake.data_columns(layout) -%}
  {%- set hint = '/*+ BROADCAST(k) */' if broadcast else '' -%}
  {#- Keys to look up are taken from the input rows (no window: a superset of the winners' keys is harmless). -#}
  {%- set input_keys -%}
    {%- for key in keys %}{{ layout.key_exprs[key] }} as {{ cdclake.quote(key) }}{% if not loop.last %}, {% endif %}{% endfor %} from ({{ input_sql }}) i where i.op in ('c', 'u', 'd', 'r')
  {%- endset -%}
  {%- set below = 'true' if applied_position is none else (cdclake.change_position('i') ~ " <= " ~ cdclake.position_literal(applied_position)) -%}
  {#- layout.unit_after_applied: no change of the unit is at or below applied_position (bronze's order counts). -#}
  {%- if layout.get('unit_after_applied') %}{% set below = 'false' %}{% endif -%}
  {%- set looked_up = ("i.op = 'd' or " ~ below) if delete_mode == 'soft' else below -%}
  {#- Hard deletes read nothing else of silver: without a lookup, silver is left out of the query. -#}
  {%- set reads_silver = looked_up != 'false' -%}
  {%- set lookups = (['t'] if reads_silver else []) + (['bx'] if delete_mode == 'hard' else []) -%}
  {%- if delete_mode == 'soft' -%}
    {#- Soft deletes: where the values of silver's row come from (its own change; a soft-deleted row's kept values:
        _cdc_values_position, null on rows written before cdclake kept it, where it is unknown) ... -#}
    {%- set held_values = "case when t._cdc_op = 'd' then t._cdc_values_position else " ~ cdclake.position('t') ~ " end" -%}
    {#- ... so a winning delete keeps silver's values unless the unit holds newer ones, and a change older than
        silver's soft-deleted row but newer than the values it kept (a late one, or one beside a replay of the
        row's delete) gives it its values, the delete staying: what --full-refresh, which sees every change in one
        unit, gives. A delete of a key deleted at its position already, at another offset, is a replay of it. -#}
    {%- set held_position = "coalesce(" ~ held_values ~ ", " ~ cdclake.position('t') ~ ")" -%}
    {#- (Values from before a truncate are void: a row that holds such values keeps none.) -#}
    {%- set keeps_held_values = "(s._cdc_op = 'd' and t._cdc_found and (not s._cdc_has_image or s._cdc_prior_position <= " ~ held_position ~ ")" ~ (" and " ~ held_position ~ " > " ~ truncate.literal if truncate is not none else "") ~ ")" -%}
    {%- set replayed_delete = "(s._cdc_op = 'd' and t._cdc_op <=> 'd' and s._cdc_order = t._cdc_order and s._cdc_offset <> t._cdc_offset)" -%}
    {%- set late_values = "(t._cdc_op = 'd' and (" ~ cdclake.position('s') ~ " < " ~ cdclake.position('t') ~ " or " ~ replayed_delete ~ ") and s._cdc_has_image and s._cdc_prior_position > t._cdc_values_position)" -%}
  {%- endif -%}
  create or replace table {{ batch }}
  using iceberg
  tblproperties ('format-version' = '2', 'write.parquet.compression-codec' = 'snappy', 'write.distribution-mode' = 'none',
    'write.metadata.delete-after-commit.enabled' = 'true', 'write.metadata.previous-versions-max' = '2')
  as select {% if broadcast %}/*+ {% for lookup in lookups %}BROADCAST({{ lookup }}){% if not loop.last %}, {% endif %}{% endfor %} */{% endif %}
    {%- for key in keys %}
    s.{{ cdclake.quote(key) }},
    {%- endfor %}
    {%- for column in columns if column not in keys %}
    {% if delete_mode == 'soft' %}case when {{ keeps_held_values }} then t.{{ cdclake.quote(column) }} else s.{{ cdclake.quote(column) }} end{% else %}s.{{ cdclake.quote(column) }}{% endif %} as {{ cdclake.quote(column) }},
    {%- endfor %}
    {%- if delete_mode == 'soft' %}
    {%- for column in ['_cdc_order', '_cdc_op', '_cdc_offset', '_cdc_source_ts'] %}
    case when {{ late_values }} then t.{{ column }} else s.{{ column }} end as {{ column }},
    {%- endfor %}
    s._cdc_applied_at,
    s._cdc_op = 'd' or {{ late_values }} as _cdc_deleted,
    case when {{ late_values }} then t._cdc_deleted_at when s._cdc_op = 'd' then current_timestamp() end as _cdc_deleted_at,
    case when {{ late_values }} then s._cdc_prior_position when s._cdc_op <> 'd' then null
      when {{ keeps_held_values }} then {{ held_values }} else coalesce(s._cdc_prior_position, {{ cdclake.no_values_position() }}) end as _cdc_values_position
    {%- else %}
    s._cdc_order, s._cdc_op, s._cdc_offset, s._cdc_source_ts, s._cdc_applied_at,
    bx._cdc_found is not null as _cdc_has_tombstone
    {%- endif %}
  from (select {{ cdclake.silver_select(layout, 'w') }}{% if delete_mode == 'soft' %}, w._cdc_has_image, w._cdc_prior_position{% endif %} from ({{ cdclake.net_effect_sql(cdclake.after_truncate_sql(input_sql, truncate), layout) }}) w) s
  {%- if reads_silver %}
  left join (
    select {{ hint }} {% for key in keys %}t.{{ cdclake.quote(key) }}, {% endfor %}t._cdc_order, t._cdc_op, t._cdc_offset,
      {%- if delete_mode == 'soft' %}{% for column in columns if column not in keys %} t.{{ cdclake.quote(column) }},{% endfor %} t._cdc_source_ts, t._cdc_deleted_at, t._cdc_values_position,{% endif %} true as _cdc_found
    from {{ target }} t
    left semi join (select {{ input_keys }} and ({{ looked_up }})) k on {{ cdclake.key_match(keys, 't', 'k') }}
  ) t on {{ cdclake.key_match(keys, 's', 't') }}
  {%- endif %}
  {%- if delete_mode == 'hard' %}
  left join (
    select {{ hint }} {% for key in keys %}b.{{ cdclake.quote(key) }}, {% endfor %}max({{ cdclake.position('b') }}) as _cdc_position, true as _cdc_found
    from {{ tombstones }} b
    left semi join (select {{ input_keys }}) k on {{ cdclake.key_match(keys, 'b', 'k') }}
    group by {% for key in keys %}b.{{ cdclake.quote(key) }}{% if not loop.last %}, {% endif %}{% endfor %}
  ) bx on {{ cdclake.key_match(keys, 's', 'bx') }}
  {%- endif %}
  where {% if reads_silver %}(t._cdc_found is null or {{ cdclake.position('s') }} > {{ cdclake.position('t') }}{% if delete_mode == 'soft' %} or {{ late_values }}{% endif %}){% else %}true{% endif %}
  {#- A delete of a key deleted at its position already, at another offset (a replay), is that delete: nothing to do
      (applied again, it would move the delete's _cdc_deleted_at, and with it the tombstone horizon), but for the
      newer values its unit may give a soft-deleted row. The same record read again is applied (see "a delete at its
      tombstone's position" in docs/silver.md). -#}
  {%- if delete_mode == 'soft' %}
    and not ({{ replayed_delete }} and not coalesce({{ late_values }}, false))
  {%- else %}
    and (bx._cdc_found is null or {{ cdclake.position('s') }} > bx._cdc_position or (s._cdc_op = 'd' and {{ cdclake.position('s') }} = bx._cdc_position))
    and not (s._cdc_op = 'd' and s._cdc_order <=> bx._cdc_position.o and s._cdc_offset <> bx._cdc_position.f)
  {%- endif %}
{%- endmacro %}


{#-
  What the batch asks for: keys to remove from silver, rows to insert, tombstones to update or retire,
  tombstones to add; the new applied position (JSON): the greatest of the old one and the batch's, or of the old
  one and `bound` (a position no change of the unit is above, JSON), which spares reading the batch's positions
  (arrays, which Iceberg reads row by row: 0.1 s of a 100k-row batch's 0.25-0.3 s); and its rows with a null key
  part (none, usually).
-#}
{% macro batch_stats_sql(batch, layout, delete_mode, applied_position, bound=none) -%}
  {%- set greatest = 'max(' ~ cdclake.position('s') ~ ')' if bound is none else cdclake.position_literal(bound) -%}
  select
    count(*),
    {%- if delete_mode == 'hard' %}
    count_if(s._cdc_op <> 'd'), count_if(s._cdc_has_tombstone), count_if(s._cdc_op = 'd' and not s._cdc_has_tombstone),
    {%- else %}
    count(*), 0, 0,
    {%- endif %}
    to_json({% if applied_position is none %}{{ greatest }}{% else %}greatest({{ cdclake.position_literal(applied_position) }}, {{ greatest }}){% endif %}),
    count_if({% for key in layout.key_columns %}s.{{ cdclake.quote(key) }} is null{% if not loop.last %} or {% endif %}{% endfor %})
  from {{ batch }} s
{%- endmacro %}


{#-
  Removes the silver rows the batch replaces or deletes and, with a truncate new in this unit, every row older
  than it. The keys are matched in a (broadcast) exists-subquery: silver's key column is scanned, not shuffled.
  `null_safe`: false when the batch holds no null key (key_match).
-#}
{% macro silver_delete_sql(layout, batch, relation, truncate, broadcast, null_safe=true) -%}
  delete from {{ relation }} t
  where exists (select {% if broadcast %}/*+ BROADCAST(s) */ {% endif %}1 from {{ batch }} s where {{ cdclake.key_match(layout.key_columns, 's', 't', null_safe) }})
  {%- if truncate is not none %}
  or {{ cdclake.position('t') }} < {{ truncate.literal }}
  {%- endif %}
{%- endmacro %}


{#- The batch's rows that silver holds from now on (every row in soft mode: a delete is a flagged row). -#}
{% macro silver_insert_sql(layout, batch, relation, delete_mode) -%}
  {%- set columns = cdclake.data_columns(layout) -%}
  {%- set metadata = ['_cdc_order', '_cdc_op', '_cdc_offset', '_cdc_source_ts', '_cdc_applied_at'] + (['_cdc_deleted', '_cdc_deleted_at', '_cdc_values_position'] if delete_mode == 'soft' else []) -%}
  insert into {{ relation }} ({% for column in columns %}{{ cdclake.quote(column) }}, {% endfor %}{{ metadata | join(', ') }})
  select {% for column in columns %}s.{{ cdclake.quote(column) }}, {% endfor %}{% for column in metadata %}s.{{ column }}{% if not loop.last %}, {% endif %}{% endfor %}
  from {{ batch }} s
  {%- if delete_mode == 'hard' %}
  where s._cdc_op <> 'd'
  {%- endif %}
{%- endmacro %}


{#-
  Tombstones of touched keys: a newer delete updates its key's tombstone, a newer upsert retires it. A tombstone
  older than its key's silver row (a late delete) is harmless: any change that passes the silver row's guard is
  newer than it too. Matched-only: Spark plans it as an inner join, which broadcasts the batch.
-#}
{% macro tombstone_merge_sql(layout, batch, tombstones, null_safe=true) -%}
  merge into {{ tombstones }} b
  using (select * from {{ batch }} s where s._cdc_has_tombstone) s
  on {{ cdclake.key_match(layout.key_columns, 'b', 's', null_safe) }}
  when matched and s._cdc_op = 'd' then update set
    b._cdc_order = s._cdc_order, b._cdc_op = s._cdc_op, b._cdc_offset = s._cdc_offset,
    {#- The tombstone's own delete, read again (a re-read of bronze, a run killed after this merge): deleted then,
        not now, or tombstone_horizon_days would count from every re-read. -#}
    b._cdc_deleted_at = case when b._cdc_order <=> s._cdc_order and b._cdc_offset = s._cdc_offset then b._cdc_deleted_at else current_timestamp() end
  when matched then delete
{%- endmacro %}


{#- Deletes of keys without a tombstone become tombstones. -#}
{% macro tombstone_insert_sql(layout, batch, tombstones) -%}
  insert into {{ tombstones }} ({% for key in layout.key_columns %}{{ cdclake.quote(key) }}, {% endfor %}_cdc_order, _cdc_op, _cdc_offset, _cdc_deleted_at)
  select {% for key in layout.key_columns %}s.{{ cdclake.quote(key) }}, {% endfor %}s._cdc_order, s._cdc_op, s._cdc_offset, current_timestamp()
  from {{ batch }} s
  where s._cdc_op = 'd' and not s._cdc_has_tombstone
{%- endmacro %}
