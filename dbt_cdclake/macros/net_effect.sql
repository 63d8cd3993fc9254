{#-
  Net effect of one unit of work (IBM CDC "external table mirror bulk apply", seed 002):
  per key the last change wins; an update is a delete followed by an insert of the new image; an insert deleted
  in the same unit of work leaves nothing; deletes delete. "Last" is the total order of changes of one key:
  bronze's source position (_cdc_order), then op (r < c < u < d, a snapshot read is older than a change at the
  same position), then the Kafka offset. Each macro is dispatched, so a project can override it.
-#}

{% macro op_rank(op) -%}
  {{ return(adapter.dispatch('op_rank', 'cdclake')(op)) }}
{%- endmacro %}

{% macro default__op_rank(op) -%}
  case {{ op }} when 'r' then 0 when 'c' then 1 when 'u' then 2 when 'd' then 3 else 4 end
{%- endmacro %}


{#- A comparable value of a change's place in the order; works on bronze-derived rows and on silver rows. -#}
{% macro position(alias) -%}
  named_struct('o', {{ alias }}._cdc_order, 'r', {{ cdclake.op_rank(alias ~ '._cdc_op') }}, 'f', {{ alias }}._cdc_offset)
{%- endmacro %}

{#- The same of a bronze row, whose op is in `op`. -#}
{% macro change_position(alias) -%}
  named_struct('o', {{ alias }}._cdc_order, 'r', {{ cdclake.op_rank(alias ~ '.op') }}, 'f', {{ alias }}._cdc_offset)
{%- endmacro %}


{#-
  Rows of the same key: null-safe (a key column may be null, as a column named in `keys` or a part of a key
  without a primary key, and a null key is one key). `null_safe=false` where one side is known to hold no null
  key, which makes it the same match: Spark then hashes the key itself, not (coalesce, isnull) pairs (the
  DELETE's scan of 10M silver rows: 0.87 s instead of 1.34 s, docs/silver.md).
-#}
{% macro key_match(keys, left, right, null_safe=true) -%}
  {%- set operator = '<=>' if null_safe else '=' -%}
  {%- for key in keys %}{{ left }}.{{ cdclake.quote(key) }} {{ operator }} {{ right }}.{{ cdclake.quote(key) }}{% if not loop.last %} and {% endif %}{% endfor -%}
{%- endmacro %}


{#-
  The winners of a unit of work: one row per key, the latest change. Tombstone records (op null) carry nothing
  for silver: the delete event before them already says it all. Truncates are handled by the materialization.
  With `layout.keep_deleted_images` (soft deletes), a winning delete carries the image (and extracted columns) of
  its key's latest change that is not a delete, `_cdc_has_image` says whether the input held one and
  `_cdc_prior_position` where that change is: a soft-deleted row keeps the values its key had, however the changes
  were split into units of work (the materialization keeps silver's row where it is newer: a late change).
-#}
{% macro net_effect_sql(input_sql, layout) -%}
  {{ return(adapter.dispatch('net_effect_sql', 'cdclake')(input_sql, layout)) }}
{%- endmacro %}

{% macro default__net_effect_sql(input_sql, layout) -%}
with changes as (
  select
    {%- for key in layout.key_columns %}
    {{ layout.key_exprs[key] }} as {{ cdclake.quote(key) }},
    {%- endfor %}
    _cdc_order,
    op as _cdc_op,
    _cdc_offset,
    {{ layout.source_ts_expr }} as _cdc_source_ts,
    {%- for column in layout.extra_columns %}
    {{ cdclake.quote(column) }},
    {%- endfor %}
    {{ layout.image_expr }} as _cdc_image
  from ({{ input_sql }}) bronze_input
  where op in ('c', 'u', 'd', 'r')
),
{%- set partition -%}
  partition by {% for key in layout.key_columns %}{{ cdclake.quote(key) }}{% if not loop.last %}, {% endif %}{% endfor %}
  order by _cdc_order desc, {{ cdclake.op_rank('_cdc_op') }} desc, _cdc_offset desc
{%- endset -%}
{%- set keep = layout.get('keep_deleted_images', false) -%}
ranked as (
  select *,
    row_number() over ({{ partition }}) as _cdc_rank
    {%- if keep %},
    first_value(case when _cdc_op <> 'd' and _cdc_image is not null then named_struct('image', _cdc_image
      {%- for column in layout.extra_columns %}, 'x{{ loop.index }}', {{ cdclake.quote(column) }}{% endfor %}, 'p', {{ cdclake.position('changes') }}) end, true)
      over ({{ partition }} rows between unbounded preceding and unbounded following) as _cdc_prior
    {%- endif %}
  from changes
)
{%- if keep %}
select
  {%- for key in layout.key_columns %}
  {{ cdclake.quote(key) }},
  {%- endfor %}
  _cdc_order, _cdc_op, _cdc_offset, _cdc_source_ts,
  {%- for column in layout.extra_columns %}
  case when _cdc_op = 'd' then _cdc_prior.x{{ loop.index }} else {{ cdclake.quote(column) }} end as {{ cdclake.quote(column) }},
  {%- endfor %}
  case when _cdc_op = 'd' then _cdc_prior.image else _cdc_image end as _cdc_image,
  _cdc_op <> 'd' or _cdc_prior is not null as _cdc_has_image,
  _cdc_prior.p as _cdc_prior_position,
  _cdc_rank
from ranked where _cdc_rank = 1
{%- else %}
select * from ranked where _cdc_rank = 1
{%- endif %}
{%- endmacro %}


{#- The silver columns of a winner: keys, image columns, extracted columns, then cdclake's metadata. -#}
{% macro silver_select(layout, alias) -%}
  {%- for key in layout.key_columns %}{{ alias }}.{{ cdclake.quote(key) }}, {% endfor -%}
  {%- for column in layout.image_columns %}{{ alias }}._cdc_image.{{ cdclake.quote(column) }} as {{ cdclake.quote(column) }}, {% endfor -%}
  {%- if layout.document %}{{ alias }}._cdc_image as _cdc_document, {% endif -%}
  {%- for column in layout.extra_columns %}{{ alias }}.{{ cdclake.quote(column) }}, {% endfor -%}
  {{ alias }}._cdc_order, {{ alias }}._cdc_op, {{ alias }}._cdc_offset, {{ alias }}._cdc_source_ts,
  current_timestamp() as _cdc_applied_at
{%- endmacro %}


{#- Column names of a silver row (no metadata), in silver_select's order. -#}
{% macro data_columns(layout) -%}
  {%- set columns = [] -%}
  {%- for key in layout.key_columns %}{% do columns.append(key) %}{% endfor -%}
  {%- for column in layout.image_columns %}{% do columns.append(column) %}{% endfor -%}
  {%- if layout.document %}{% do columns.append('_cdc_document') %}{% endif -%}
  {%- for column in layout.extra_columns %}{% do columns.append(column) %}{% endfor -%}
  {{ return(columns) }}
{%- endmacro %}


{#-
  A Spark identifier for a column name that comes from a source database: backquoted, with backquotes doubled,
  so a hostile name cannot close the quote (dbt-spark's adapter.quote does not escape).
-#}
{% macro quote(name) -%}
  `{{ name | replace('`', '``') }}`
{%- endmacro %}


{#- Text as a SQL string literal. -#}
{% macro sql_string(text) -%}
  '{{ text | replace("\\", "\\\\") | replace("'", "\\'") }}'
{%- endmacro %}
