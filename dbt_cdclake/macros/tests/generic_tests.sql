{#- Generic tests shipped with cdclake; `cdclake scaffold` adds them to every silver model's YAML. They work on
    current-state tables and on history tables (history='scd2'), whose current rows are the current state. -#}

{#-
  How to read a silver table: `live`, a condition true for its rows that are current and not (soft) deleted;
  `current`, true for its current rows; `order`, the column with the position of the change that made the row.
-#}
{% macro silver_shape(model) -%}
  {%- set described = adapter.get_columns_in_relation(model) if execute else [] -%}
  {%- set columns = described | map(attribute='name') | list -%}
  {%- set current = '_cdc_is_current' if '_cdc_is_current' in columns else 'true' -%}
  {%- set live = current ~ (' and _cdc_deleted is not true' if '_cdc_deleted' in columns else '') -%}
  {{ return({'current': current, 'live': live, 'history': '_cdc_is_current' in columns,
             'deleted': '_cdc_deleted' in columns, 'columns': described,
             'order': '_cdc_valid_from' if '_cdc_valid_from' in columns else '_cdc_order'}) }}
{%- endmacro %}


{#- `dbt build --empty` renders every ref and source as an empty subquery, to check a project without reading its
    data: there is nothing to test then, and the tests' reads of table metadata (columns, snapshots) would fail on
    a subquery. What each test is then: a query of no rows. -#}
{% macro reads_no_data() -%}
  {{ return(invocation_args_dict.get('empty', false)) }}
{%- endmacro %}

{% macro no_problems() -%}
  select 'none' as problem where false
{%- endmacro %}


{#- Each key appears once in silver (in a history table: once among the current rows, each version once, also
    when replayed at another offset (the same position, op and image as the key's version before it: scd2.sql
    keeps the first copy), and a key's versions follow one another: each ends where the next starts, or before it
    where a hard delete or a truncate ended it; only the last may be open, and open is current). -#}
{% test cdclake_keys_unique(model, keys) %}
  {%- if keys is string %}{% set keys = [keys] %}{% endif -%}
  {%- if cdclake.reads_no_data() %}{{ return(cdclake.no_problems()) }}{% endif -%}
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
  {%- set values = [] -%}
  {%- for column in shape.columns %}{% if column.name not in keys and (column.name == '_cdc_document' or not column.name.startswith('_cdc_')) %}{% do values.append(column.name) %}{% endif %}{% endfor %}
  select 'version stored again at another offset' as problem, {{ by_key }}, count(*) as copies
  from (
    select {{ by_key }}, _cdc_identity,
      lag(_cdc_identity) over (partition by {{ by_key }} order by _cdc_valid_from, {{ cdclake.op_rank('_cdc_op') }}, _cdc_offset) as _cdc_previous
    from (
      select *, named_struct('o', _cdc_valid_from, 'op', _cdc_op,
        'v', to_json(named_struct('v', ''{% for column in values %}, 'c{{ loop.index }}', {{ cdclake.quote(column) }}{% endfor %}))) as _cdc_identity
      from {{ model }}
    ) identified
  ) versions
  where _cdc_identity = _cdc_previous
  group by {{ by_key }}
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


{#- The latest change per key over ALL of bronze (a full recomputation), as (keys, position, op, its `after`,
    `_cdc_partial`: whether its image may be partial: an update, or a primary-key change's create); with `snapshot`,
    over bronze as of that snapshot; with `bronze_where`, over the bronze rows the model's own `where` keeps; with
    `held` (tested_state), without the changes silver holds back. `bronze_types`: describe_columns of bronze, when
    the caller has read them. -#}
{% macro recomputed_latest(bronze, keys, snapshot=none, bronze_where=none, held=none, bronze_types=none) -%}
  {%- set kept = '' if bronze_where is none else ' where (' ~ bronze_where ~ ')' -%}
  {#- Keys read as the model reads them (silver_layout): from the Kafka key, or from the images of a keyless table. -#}
  {%- set types = bronze_types if bronze_types is not none else (cdclake.bronze_columns(bronze) if execute else {}) -%}
  {%- set reading = cdclake.key_reading(bronze, keys, types) if execute else {'exprs': {}, 'moves': none} -%}
  {%- set key_exprs = reading.exprs -%}
  {%- set read = 'select * from ' ~ bronze ~ (' version as of ' ~ snapshot if snapshot else '') -%}
  {#- Held changes first, the model's `where` after, as the model reads them (its SQL reads what is not held). -#}
  {%- if held is not none and execute -%}
    {%- set read = cdclake.tested_without_held_sql('(' ~ read ~ ')', cdclake.held_key_reading(reading, keys, types), cdclake.transaction_reading(bronze, types), held) -%}
  {%- endif -%}
  {%- set read = 'select * from (' ~ read ~ ') read_rows' ~ kept if kept else read -%}
  {#- An update that moved its row to another key deletes the old key, as the model applies it. -#}
  {%- set rows = cdclake.with_key_changes(read, types.keys() | list, reading.moves) -%}
  select * from (
    select
      {%- for key in keys %}
      {{ key_exprs.get(key, 'null') }} as {{ cdclake.quote(key) }},
      {%- endfor %}
      _cdc_order, op as _cdc_op, _cdc_offset, after,
      {{ cdclake.partial_change_sql('_cdc_headers' in types) }} as _cdc_partial,
      row_number() over (
        partition by {% for key in keys %}{{ key_exprs.get(key, 'null') }}{% if not loop.last %}, {% endif %}{% endfor %}
        order by _cdc_order desc, {{ cdclake.op_rank('op') }} desc, _cdc_offset desc) as _cdc_rank
    from ({{ rows }}) bronze_rows
    where op in ('c', 'u', 'd', 'r')
      {#- the latest truncate voids every change older than it -#}
      and not coalesce(named_struct('o', _cdc_order, 'r', {{ cdclake.op_rank('op') }}, 'f', _cdc_offset) < (
        select max(named_struct('o', _cdc_order, 'r', {{ cdclake.op_rank('op') }}, 'f', _cdc_offset))
        from ({{ read }}) truncates where op = 't'), false)
  ) where _cdc_rank = 1
{%- endmacro %}


{#- The rows of `changes` (a parenthesised query) but those `held` holds back (held_changes_sql), for the tests,
    which write no table. Up to 1,000 held changes (the project variable cdclake_tests_listed_held_changes) are
    listed in the query itself, each as the JSON of its coordinates, which Spark plans at once. More are read
    through held_changes_sql's query: when rows moved between keys touch a held key, its rounds of held keys are
    views that nest one another, and Spark plans them again wherever the recomputation reads bronze (tens of
    seconds for a few rounds). -#}
{% macro tested_without_held_sql(changes, keys, reading, held) -%}
  {%- set held_changes = '(' ~ cdclake.held_changes_sql(changes, keys, reading, held) ~ ')' -%}
  {%- set coordinates = "to_json(named_struct('t', {0}t, 'pt', {0}pt, 'f', {0}f, 'o', {0}o))" -%}
  {%- set most = [var('cdclake_tests_listed_held_changes', 1000) | int, 0] | max -%}
  {%- set listed = run_query('select distinct ' ~ coordinates.format('h.') ~ ' from ' ~ held_changes ~ ' h limit ' ~ (most + 1)).columns[0].values() | list -%}
  {%- if listed | length > most %}{{ return(cdclake.without_held_changes_sql(changes, held_changes)) }}{% endif -%}
  {%- set rows = [] -%}
  {%- for json in listed %}{% do rows.append('(' ~ cdclake.sql_string(json) ~ ')') %}{% endfor -%}
  {%- set bronze_coordinates = "to_json(named_struct('t', c._cdc_topic, 'pt', c._cdc_partition, 'f', c._cdc_offset, 'o', c._cdc_order))" -%}
  {{ return('select c.* from ' ~ changes ~ ' c' ~ (' left anti join (values ' ~ rows | join(', ') ~ ') h(j) on ' ~ bronze_coordinates ~ ' = h.j' if rows else '')) }}
{%- endmacro %}


{#- What the recomputing tests read of silver, from one read of its properties: {'snapshot': the bronze snapshot
    it has applied (they compare with bronze as of it, so an ingester that commits while `dbt build` runs does not
    make them fail), 'held': the transactions it holds until they are complete (complete_transactions,
    transactions.sql), whose changes (and the later changes of their keys) they leave out of the recomputation;
    none when nothing is held, 'properties': all of them}. -#}
{% macro tested_state(model) -%}
  {%- set properties = cdclake.table_properties(model) if execute else {} -%}
  {{ return({'snapshot': properties.get('cdclake.bronze_snapshot_id'), 'held': cdclake.held_transactions(properties), 'properties': properties}) }}
{%- endmacro %}


{#- The columns cdclake_equals_recompute compares with the winning change's image: the image columns silver's last
    run applied (its property cdclake.images; none for a table no run has written it to yet) that silver has and
    bronze's typed `after` names (not the model's extracted columns, not a document), as [{'name', 'field',
    'type', 'skip'}] (`type`: silver's, where the expected value is cast to it; none for a nested type, compared
    as JSON text: Spark cannot compare maps). `skip`: when the change does not carry the value (a condition on the
    recomputation's row), as that run read partial images: an update's (or a primary-key change's create's) nulls
    with ignore_null_updates, the placeholder of an unchanged TOAST or LOB column. -#}
{% macro recompute_value_columns(properties, bronze, shape, types) -%}
  {%- set images = fromjson(properties.get('cdclake.images') or 'null') -%}
  {%- if images is none or not types.get('after', '').startswith('struct') %}{{ return([]) }}{% endif -%}
  {%- set fields = {} -%}
  {%- for field in cdclake.struct_field_names(bronze, 'after') %}{% do fields.update({field | lower: field}) %}{% endfor -%}
  {%- set applied = images.get('image_columns', []) | map('lower') | list -%}
  {%- set placeholder = images.get('unavailable_value') -%}
  {%- set compared = [] -%}
  {%- for column in shape.columns if column.name | lower in applied and column.name | lower in fields -%}
    {%- set field = fields[column.name | lower] -%}
    {%- set skips = [] -%}
    {%- if images.get('ignore_null_updates') %}{% do skips.append('after.' ~ cdclake.quote(field) ~ ' is null') %}{% endif -%}
    {%- if placeholder is not none %}{% do skips.append(cdclake.unavailable_sql(field, placeholder)) %}{% endif -%}
    {%- do compared.append({'name': column.name, 'field': field, 'type': none if '<' in column.dtype else column.dtype,
                            'skip': "_cdc_partial and (" ~ skips | join(' or ') ~ ")" if skips else 'false'}) -%}
  {%- endfor -%}
  {{ return(compared) }}
{%- endmacro %}


{#- Silver equals a full recomputation from bronze: same live keys, each at the same change (position and op: a
    replay of a change at another offset is the same change, and a history keeps the copy it stored first), holding
    that change's values (recompute_value_columns: what an update does not carry is the fold's, not compared).
    `bronze_where`: the condition of the model's own `where`, for a model that reads only some of bronze. -#}
{% test cdclake_equals_recompute(model, bronze, keys, bronze_where=none) %}
  {%- if keys is string %}{% set keys = [keys] %}{% endif -%}
  {%- if cdclake.reads_no_data() %}{{ return(cdclake.no_problems()) }}{% endif -%}
  {%- set shape = cdclake.silver_shape(model) -%}
  {%- set state = cdclake.tested_state(model) -%}
  {%- set types = cdclake.bronze_columns(bronze) -%}
  {%- set compared = cdclake.recompute_value_columns(state.properties, bronze, shape, types) if execute else [] -%}
  {%- set key_list -%}{% for key in keys %}{{ cdclake.quote(key) }}, {% endfor %}{%- endset -%}
  with expected as (
    select {{ key_list }}_cdc_order, _cdc_op
      {%- for column in compared %},
      {%- set value = 'after.' ~ cdclake.quote(column.field) %}
      case when {{ column.skip }} then null else named_struct('v', {% if column.type %}cast({{ value }} as {{ column.type }}){% else %}{{ value }}{% endif %}) end as _cdc_value_{{ loop.index0 }}
      {%- endfor %}
    from ({{ cdclake.recomputed_latest(bronze, keys, state.snapshot, bronze_where, state.held, types) }}) where _cdc_op <> 'd'
  ),
  actual as (
    select {{ key_list }}{{ shape.order }} as _cdc_order, _cdc_op
      {%- for column in compared %}, {{ cdclake.quote(column.name) }}{% endfor %}
    from {{ model }} where {{ shape.live }}
  )
  {#- One full join of the two: a set difference each way and a join computed the recomputation three times (twice
      the time, measured on a few rows). A row silver holds twice is reported twice. -#}
  select problem, {{ key_list }}_cdc_order, _cdc_op, if(_cdc_expected and _cdc_in_silver, columns_differing, cast(null as string)) as columns_differing from (
    select case when _cdc_in_silver is null then 'missing from silver' when _cdc_expected is null then 'not in recomputation'
      when columns_differing <> '' then 'values differ from the recomputation' end as problem, *
    from (
      select e._cdc_found as _cdc_expected, a._cdc_found as _cdc_in_silver,
        {%- for key in keys %} if(a._cdc_found, a.{{ cdclake.quote(key) }}, e.{{ cdclake.quote(key) }}) as {{ cdclake.quote(key) }},{% endfor %}
        if(a._cdc_found, a._cdc_order, e._cdc_order) as _cdc_order, if(a._cdc_found, a._cdc_op, e._cdc_op) as _cdc_op,
        {%- if compared %}
        concat_ws(', '
        {%- for column in compared %},
        {%- set actual_value = 'a.' ~ cdclake.quote(column.name) %}
        {%- set expected_value = 'e._cdc_value_' ~ loop.index0 ~ '.v' %}
          case when not (e._cdc_value_{{ loop.index0 }} is null or
          {%- if not column.type %} to_json(named_struct('v', {{ expected_value }})) <=> to_json(named_struct('v', {{ actual_value }}))
          {%- else %} {{ expected_value }} <=> {{ actual_value }}{% endif %}) then {{ cdclake.sql_string(column.name) }} end
        {%- endfor %})
        {%- else %}
        ''
        {%- endif %} as columns_differing
      from (select *, true as _cdc_found from expected) e
      full join (select *, true as _cdc_found from actual) a
        on {{ cdclake.key_match(keys, 'a', 'e') }} and a._cdc_order <=> e._cdc_order and a._cdc_op = e._cdc_op
    ) joined
  ) compared
  where problem is not null
{% endtest %}


{#- No key whose latest bronze change is a delete is present (as a live row) in silver. -#}
{% test cdclake_no_deleted_keys(model, bronze, keys, bronze_where=none) %}
  {%- if keys is string %}{% set keys = [keys] %}{% endif -%}
  {%- if cdclake.reads_no_data() %}{{ return(cdclake.no_problems()) }}{% endif -%}
  {%- set shape = cdclake.silver_shape(model) -%}
  {%- set state = cdclake.tested_state(model) -%}
  select {% for key in keys %}s.{{ cdclake.quote(key) }}{% if not loop.last %}, {% endif %}{% endfor %}
  from {{ model }} s
  join ({{ cdclake.recomputed_latest(bronze, keys, state.snapshot, bronze_where, state.held) }}) latest
    on {{ cdclake.key_match(keys, 's', 'latest') }}
  where latest._cdc_op = 'd' and {{ shape.live }}
{% endtest %}
