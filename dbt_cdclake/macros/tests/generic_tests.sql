{#- Generic tests shipped with cdclake; `cdclake scaffold` adds them to every silver model's YAML. They work on
    current-state tables and on history tables (history='scd2'), whose current rows are the current state. -#}

{#-
  How to read a silver table: `live`, a condition true for its rows that are current and not (soft) deleted;
  `current`, true for its current rows; `order`, the column with the position of the change that made the row.
-#}
{% macro silver_shape(model) -%}
  {%- set columns = adapter.get_columns_in_relation(model) | map(attribute='name') | list if execute else [] -%}
  {%- set current = '_cdc_is_current' if '_cdc_is_current' in columns else 'true' -%}
  {%- set live = current ~ (' and _cdc_deleted is not true' if '_cdc_deleted' in columns else '') -%}
  {{ return({'current': current, 'live': live, 'history': '_cdc_is_current' in columns,
             'deleted': '_cdc_deleted' in columns,
             'order': '_cdc_valid_from' if '_cdc_valid_from' in columns else '_cdc_order'}) }}
{%- endmacro %}


{#- Each key appears once in silver (in a history table: once among the current rows, each version once, and a
    key's versions follow one another: each ends where the next starts, or before it where a hard delete or a
    truncate ended it; only the last may be open, and open is current). -#}
{% test cdclake_keys_unique(model, keys) %}
  {%- set shape = cdclake.silver_shape(model) -%}
  {%- set by_key -%}{% for key in keys %}{{ cdclake.quote(key) }}{% if not loop.last %}, {% endif %}{% endfor %}{%- endset -%}
  select 'key in more than one current row' as problem, {{ by_key }}, count(*) as copies
  from {{ model }}
  where {{ shape.current }}
  group by {{ by_key }}
  having count(*) > 1
  {%- if shape.history %}
  union all
  select 'version stored more than once' as problem, {{ by_key }}, count(*) as copies
  from {{ model }}
  group by {{ by_key }}, _cdc_valid_from, _cdc_op, _cdc_offset
  having count(*) > 1
  union all
  select 'versions overlap or an open version is not current' as problem, {{ by_key }}, count(*) as copies
  from (
    select {{ by_key }}, _cdc_valid_to, _cdc_is_current,
      lead(_cdc_valid_from) over (partition by {{ by_key }} order by _cdc_valid_from, {{ cdclake.op_rank('_cdc_op') }}, _cdc_offset) as _cdc_next_from
    from {{ model }}
  ) versions
  where _cdc_is_current <> (_cdc_valid_to is null)
    or (_cdc_next_from is not null and not coalesce(_cdc_valid_to <= _cdc_next_from, false))
    {%- if shape.deleted %}
    {#- soft deletes: deletes and truncates are versions too, so each version ends where the next starts #}
    or not (_cdc_valid_to <=> _cdc_next_from)
    {%- endif %}
  group by {{ by_key }}
  {%- endif %}
{% endtest %}


{#- The latest change per key over ALL of bronze (a full recomputation), as (keys, position, op); with `snapshot`,
    over bronze as of that snapshot; with `bronze_where`, over the bronze rows the model's own `where` keeps. -#}
{% macro recomputed_latest(bronze, keys, snapshot=none, bronze_where=none) -%}
  {%- set kept = '' if bronze_where is none else ' where (' ~ bronze_where ~ ')' -%}
  {#- Keys read as the model reads them (silver_layout): from the Kafka key, or from the images of a keyless table. -#}
  {%- set types = cdclake.describe_columns(bronze) if execute else {} -%}
  {%- set reading = cdclake.key_reading(bronze, keys, types) if execute else {'exprs': {}, 'moves': none} -%}
  {%- set key_exprs = reading.exprs -%}
  {#- An update that moved its row to another key deletes the old key, as the model applies it. -#}
  {%- set rows = cdclake.with_key_changes('select * from ' ~ bronze ~ (' version as of ' ~ snapshot if snapshot else '') ~ kept, types.keys() | list, reading.moves) -%}
  select * from (
    select
      {%- for key in keys %}
      {{ key_exprs.get(key, 'null') }} as {{ cdclake.quote(key) }},
      {%- endfor %}
      _cdc_order, op as _cdc_op, _cdc_offset,
      row_number() over (
        partition by {% for key in keys %}{{ key_exprs.get(key, 'null') }}{% if not loop.last %}, {% endif %}{% endfor %}
        order by _cdc_order desc, {{ cdclake.op_rank('op') }} desc, _cdc_offset desc) as _cdc_rank
    from ({{ rows }}) bronze_rows
    where op in ('c', 'u', 'd', 'r')
      {#- the latest truncate voids every change older than it -#}
      and not coalesce(named_struct('o', _cdc_order, 'r', {{ cdclake.op_rank('op') }}, 'f', _cdc_offset) < (
        select max(named_struct('o', _cdc_order, 'r', {{ cdclake.op_rank('op') }}, 'f', _cdc_offset))
        from {{ bronze }}{% if snapshot %} version as of {{ snapshot }}{% endif %} where op = 't'{% if bronze_where is not none %} and ({{ bronze_where }}){% endif %}), false)
  ) where _cdc_rank = 1
{%- endmacro %}


{#- The bronze snapshot silver has applied: the tests compare with bronze as of it, so an ingester that commits
    while `dbt build` runs does not make them fail. -#}
{% macro tested_snapshot(model) -%}
  {{ return(cdclake.applied_snapshot(model) if execute else none) }}
{%- endmacro %}


{#- Silver equals a full recomputation from bronze: same live keys, each at the same change (position and op: a
    replay of a change at another offset is the same change, and a history keeps the copy it stored first).
    `bronze_where`: the condition of the model's own `where`, for a model that reads only some of bronze. -#}
{% test cdclake_equals_recompute(model, bronze, keys, bronze_where=none) %}
  {%- set shape = cdclake.silver_shape(model) -%}
  with expected as (
    select {% for key in keys %}{{ cdclake.quote(key) }}, {% endfor %}_cdc_order, _cdc_op
    from ({{ cdclake.recomputed_latest(bronze, keys, cdclake.tested_snapshot(model), bronze_where) }}) where _cdc_op <> 'd'
  ),
  actual as (
    select {% for key in keys %}{{ cdclake.quote(key) }}, {% endfor %}{{ shape.order }} as _cdc_order, _cdc_op
    from {{ model }} where {{ shape.live }}
  )
  (select 'missing from silver' as problem, * from (select * from expected except select * from actual))
  union all
  (select 'not in recomputation' as problem, * from (select * from actual except select * from expected))
{% endtest %}


{#- No key whose latest bronze change is a delete is present (as a live row) in silver. -#}
{% test cdclake_no_deleted_keys(model, bronze, keys, bronze_where=none) %}
  {%- set shape = cdclake.silver_shape(model) -%}
  select {% for key in keys %}s.{{ cdclake.quote(key) }}{% if not loop.last %}, {% endif %}{% endfor %}
  from {{ model }} s
  join ({{ cdclake.recomputed_latest(bronze, keys, cdclake.tested_snapshot(model), bronze_where) }}) latest
    on {{ cdclake.key_match(keys, 's', 'latest') }}
  where latest._cdc_op = 'd' and {{ shape.live }}
{% endtest %}
