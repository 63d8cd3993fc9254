{#- Positions: how a change's place in its source's order is stored in properties and compared. -#}


{#- SQL: position struct `p` as the text stored_position reads ("<order,...>;<offset>"; null for a null `p`). -#}
{% macro stored_position_text(p) -%}
  concat(concat_ws(',', transform({{ p }}.o, x -> cast(x as string))), ';', {{ p }}.f)
{%- endmacro %}


{#- "<order,...>;<offset>" as a position literal (each part must be an integer: the text comes from a property). -#}
{% macro stored_position(text) -%}
  {%- set order, offset = text.split(';') -%}
  {%- set parts = [] -%}
  {%- for part in order.split(',') if part != '' %}{% do parts.append('cast(' ~ (part | int) ~ ' as bigint)') %}{% endfor -%}
  named_struct('o', array({{ parts | join(', ') }}), 'r', 4, 'f', cast({{ offset | int }} as bigint))
{%- endmacro %}


{#-
  Positions travel between statements as JSON ({"o": [...], "r": op rank, "f": offset}, Spark's to_json of a
  position struct) and come back into SQL through position_literal, which renders only integers.
-#}
{% macro position_json(text) -%}
  {%- set p = fromjson(text) -%}
  {{- tojson({'o': p.get('o'), 'r': p.get('r'), 'f': p.get('f')}) | replace("'", "") -}}
{%- endmacro %}


{% macro position_literal(text) -%}
  {%- set p = fromjson(text) -%}
  {%- set o = p.get('o') -%}
  named_struct('o', {% if o is none %}cast(null as array<bigint>){% else %}cast(array({% for x in o %}{% if x is none %}null{% else %}{{ x | int }}{% endif %}{% if not loop.last %}, {% endif %}{% endfor %}) as array<bigint>){% endif -%}
  , 'r', {% if p.get('r') is none %}cast(null as int){% else %}{{ p.get('r') | int }}{% endif -%}
  , 'f', {% if p.get('f') is none %}cast(null as bigint){% else %}cast({{ p.get('f') | int }} as bigint){% endif %})
{%- endmacro %}


{#- A position (JSON) at or above that of every change whose `_cdc_order` is at most `order` (JSON text of an
    array: bronze's `cdclake.order-max`): that order with the greatest op rank and offset. None when not known. -#}
{% macro order_bound_position(order) -%}
  {%- set parts = none if order in (none, '') else fromjson(order) -%}
  {%- if parts is none or parts is string or parts is mapping or parts | length == 0 %}{{ return(none) }}{% endif -%}
  {#- (position_literal renders each part as an integer: anything else would not bound the unit.) -#}
  {%- for part in parts if part is not none and (part is not number or part is boolean) %}{{ return(none) }}{% endfor -%}
  {{ return(tojson({'o': parts, 'r': 4, 'f': 9223372036854775807})) }}
{%- endmacro %}


{#-
  The greatest position silver (and the tombstones) hold, as JSON: after a first run, and once for a table made
  before cdclake.applied_position.
-#}
{% macro held_position_sql(target, tombstones, delete_mode) -%}
  select to_json(max(p)) from (
    select {{ cdclake.position('t') }} as p from {{ target }} t
    {%- if delete_mode == 'hard' %}
    union all
    select {{ cdclake.position('b') }} as p from {{ tombstones }} b
    {%- endif %}
  )
{%- endmacro %}


{#- The position a soft-deleted row whose key had no values before its delete keeps (it holds nulls): below every
    change's, so that any later-landing change before the delete gives it values. -#}
{% macro no_values_position() -%}
  named_struct('o', cast(array() as array<bigint>), 'r', -1, 'f', cast(-1 as bigint))
{%- endmacro %}


{% macro values_position_type() -%}
  struct<o: array<bigint>, r: int, f: bigint>
{%- endmacro %}
