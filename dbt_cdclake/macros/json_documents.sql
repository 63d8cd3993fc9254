{#-
  JSON documents edited in Spark SQL (no UDFs, so the same SQL runs through the Spark Thrift Server): what folds
  MongoDB partial updates (updateDescription, legacy oplog patch), and schemaless images holding Debezium's
  unavailable-value placeholder, into the document silver holds.

  Values are moved as raw JSON text, never through a typed parse, so a value keeps its JSON type ("1" stays a
  string, 1 a number, {"$numberLong": "1"} an object). The trick: get_json_object on the document wrapped in
  [ ] with a [*] path writes strings quoted, unlike a plain path. Numbers are copied by Jackson (1.10 becomes 1.1:
  the same JSON value). Rebuilt objects are compact and keep their keys' order; a new key is appended.

  An edit is a struct (op, path, value, size, event): op 'set' (value: raw JSON), 'unset', 'truncate' (size),
  'project' (keep only the top-level keys listed in path) or 'fail' (value: why); path: the dotted path split at
  dots; event: names the change event in error messages.
  Paths go through objects (a missing one is created by 'set') and through arrays by index (a 'set' beyond the
  end pads with null, as MongoDB does); 'unset' of a missing path changes nothing. Anything else (a path through
  a scalar, a key Spark's JSON path syntax cannot name, a path that could also be a field named with dots) gives
  an error naming the event instead of a document (json_error), with which the fold fails the run: a document is
  never silently wrong.

  The expressions are large: use them in a query that is analyzed once (the fold caches its result). Spark's
  analyzer resolves an expression in passes over the whole query, about one per level of nesting, and a lambda's
  body only after its function's arguments (so a `let` through transform(array(x), v -> ...) costs x's passes
  and then the body's): they are kept shallow, which takes a fold statement from 89 passes to 64.
-#}

{#- The JSON text of string `k` as an object key (quoted, escaped). -#}
{% macro json_quoted(k) -%}
  btrim(to_json(array({{ k }})), '[]')
{%- endmacro %}


{#- A get_json_object path reaching key `k` of the document wrapped in [ ]; null when Spark's path syntax cannot
    name the key: its parser takes ['name'] only without a quote or a question mark (['*'] is a wildcard), .name
    only without a dot or bracket, and skips leading whitespace in both (' b' would read key 'b'). Null: the fold
    fails (json_member), never a silently wrong member. -#}
{% macro json_key_path(k) -%}
  case when {{ k }} rlike '^\\s' then null
    when {{ k }} not in ('', '*') and not {{ k }} rlike '[\\x27?]' then concat('$[*][', chr(39), {{ k }}, chr(39), ']')
    when {{ k }} rlike '^[^.\\[*][^.\\[]*$' then concat('$[*].', {{ k }}) end
{%- endmacro %}


{#- The raw JSON of key `k` of object `c`, which has it ('null' for a JSON null); `present=false`: null when `c`
    has no key `k`. (The path is written out twice rather than bound once: see the header.) -#}
{% macro json_member(c, k, event, present=true) -%}
  {%- set path = cdclake.json_key_path(k) -%}
  case
    {%- if not present %}
    when not array_contains(json_object_keys({{ c }}), {{ k }}) then cast(null as string)
    {%- endif %}
    when ({{ path }}) is null then {{ cdclake.json_error(event, "concat('the key ', " ~ k ~ ", ' cannot be addressed in Spark SQL')") }}
    else coalesce(get_json_object(concat('[', {{ c }}, ']'), {{ path }}), 'null') end
{%- endmacro %}


{#- The raw JSON of key `k` of object `c`; null when absent. -#}
{% macro json_field(c, k, event) -%}
  {{ cdclake.json_member(c, k, event, present=false) }}
{%- endmacro %}


{#- The raw JSON of element `j` (0-based, present) of array `a`. -#}
{% macro json_element(a, j) -%}
  coalesce(get_json_object(concat('[', {{ a }}, ']'), concat('$[*][', {{ j }}, ']')), 'null')
{%- endmacro %}


{#- An error, as a value: text between two NUL characters, which JSON text never holds raw. It passes through the
    edits that follow and comes out in the folded document (see json_error_message). -#}
{% macro json_error(event, why) -%}
  concat(chr(0), 'cannot fold the update of ', {{ event }}, ': ', {{ why }}, chr(0))
{%- endmacro %}


{#- The first error in a folded document, null if none. -#}
{% macro json_error_message(document) -%}
  case when instr({{ document }}, chr(0)) > 0 then split({{ document }}, chr(0))[1] end
{%- endmacro %}


{#- Object `c` with key `k` set to raw JSON `v` (replaced in place, or appended: array_distinct keeps the first of
    each key, in order). Either way the object is written anew, compact: the same edits of the same document give
    the same text however it was spaced (a replayed update must equal the version it repeats, scd2.sql). -#}
{% macro json_object_set(c, k, v, event) -%}
  {%- set x = '_cdc_x' -%}
  concat('{', array_join(transform(array_distinct(concat(json_object_keys({{ c }}), array({{ k }}))), {{ x }} -> concat({{ cdclake.json_quoted(x) }}, ':',
    case when {{ x }} = {{ k }} then {{ v }} else {{ cdclake.json_member(c, x, event) }} end)), ','), '}')
{%- endmacro %}


{#- Object `c` without key `k`. -#}
{% macro json_object_remove(c, k, event) -%}
  {%- set x = '_cdc_x' -%}
  case when array_contains(json_object_keys({{ c }}), {{ k }}) then
      concat('{', array_join(transform(filter(json_object_keys({{ c }}), {{ x }} -> {{ x }} <> {{ k }}),
        {{ x }} -> concat({{ cdclake.json_quoted(x) }}, ':', {{ cdclake.json_member(c, x, event) }})), ','), '}')
    else {{ c }} end
{%- endmacro %}


{#- Array `a` with element `i` set to raw JSON `v`, padded with nulls up to it. -#}
{% macro json_array_set(a, i, v) -%}
  {%- set j = '_cdc_j' -%}
  concat('[', array_join(transform(sequence(0, greatest(json_array_length({{ a }}), {{ i }} + 1) - 1), {{ j }} ->
    case when {{ j }} = {{ i }} then {{ v }} when {{ j }} < json_array_length({{ a }}) then {{ cdclake.json_element(a, j) }} else 'null' end), ','), ']')
{%- endmacro %}


{#- Array `a` cut to its first `size` elements. -#}
{% macro json_array_truncate(a, size) -%}
  {%- set j = '_cdc_t' -%}
  case when least(json_array_length({{ a }}), {{ size }}) <= 0 then '[]'
    else concat('[', array_join(transform(sequence(0, least(json_array_length({{ a }}), {{ size }}) - 1), {{ j }} -> {{ cdclake.json_element(a, j) }}), ','), ']') end
{%- endmacro %}


{#- The raw JSON under path segment `seg` of container `c` (object key or array index); null when absent. -#}
{% macro json_child(c, seg, event) -%}
  case when left({{ c }}, 1) = '{' then {{ cdclake.json_field(c, seg, event) }}
    when left({{ c }}, 1) = '[' and {{ seg }} rlike '^[0-9]{1,9}$' and cast({{ seg }} as int) < json_array_length({{ c }})
      then {{ cdclake.json_element(c, 'cast(' ~ seg ~ ' as int)') }} end
{%- endmacro %}


{#-
  Document `doc` (raw JSON text) after edit `edit` (see the header). The containers along the path are collected
  top-down (aggregate), and rebuilt bottom-up (aggregate again) starting with the leaf's parent, whose member the
  edit changes: the SQL has the same size for any path depth. (The leaf is edited inside the rebuilding aggregate,
  not as its start value: a lambda is resolved after its start value, which would add the edit's passes to the
  rebuild's, see the header.)
-#}
{% macro json_apply_edit(doc, edit) -%}
  {{ return(adapter.dispatch('json_apply_edit', 'cdclake')(doc, edit)) }}
{%- endmacro %}

{% macro default__json_apply_edit(doc, edit) -%}
  {%- set event = edit ~ '.event' -%}
  {%- set cannot = cdclake.json_error(event, "concat('cannot ', " ~ edit ~ ".op, ' ', array_join(" ~ edit ~ ".path, '.'), ' in this document')") -%}
  {%- set parents = 'case when size(' ~ edit ~ '.path) > 1 then sequence(0, size(' ~ edit ~ '.path) - 2) else array() end' -%}
  case
    when instr({{ doc }}, chr(0)) > 0 then {{ doc }}
    when {{ edit }}.op = 'fail' then {{ cdclake.json_error(event, edit ~ '.value') }}
    when {{ edit }}.op <> 'project' and size({{ edit }}.path) = 0 then {{ cannot }}
    when {{ doc }} is null or left({{ doc }}, 1) <> '{' then {{ cdclake.json_error(event, "'the document before it is not a JSON object'") }}
    {#- Debezium writes a non-finite double of a full document as a bare NaN or Infinity, which is not JSON: Spark
        reads no key of it, and every edit would give null (a document silently lost). #}
    when json_object_keys({{ doc }}) is null then {{ cdclake.json_error(event, "'the document before it is not valid JSON (a bare NaN or Infinity: how Debezium writes a double that is not a number in its default and strict json.serialization.mode; extended and relaxed write valid JSON)'") }}
    when {{ edit }}.op = 'project' then concat('{', array_join(transform(filter(json_object_keys({{ doc }}), _cdc_x -> array_contains({{ edit }}.path, _cdc_x)),
      _cdc_x -> concat({{ cdclake.json_quoted('_cdc_x') }}, ':', {{ cdclake.json_member(doc, '_cdc_x', event) }})), ','), '}')
    else element_at(transform(array(
      {#- the containers from the document down to the leaf's parent (null where absent; 'set' creates objects) #}
      aggregate({{ parents }}, array({{ doc }}), (_cdc_cs, _cdc_i) -> concat(_cdc_cs, array(coalesce(
        {{ cdclake.json_child('element_at(_cdc_cs, -1)', edit ~ '.path[_cdc_i]', event) }}, case when {{ edit }}.op = 'set' then '{}' end))))
    ), _cdc_cs -> case
      {#- a key named like the rest of the path, or like a dotted start of it ("a.b" under a, for a.b or a.b.c): a
          field named with dots, or a nested path? Asked first: where the nested path is missing, the field's
          remove or truncate would otherwise change nothing. #}
      when exists({{ parents }}, _cdc_i -> left(_cdc_cs[_cdc_i], 1) = '{'
          and exists(json_object_keys(_cdc_cs[_cdc_i]), _cdc_y -> instr(_cdc_y, '.') > 0
            and startswith(concat(array_join(slice({{ edit }}.path, _cdc_i + 1, size({{ edit }}.path)), '.'), '.'), concat(_cdc_y, '.'))))
        then {{ cdclake.json_error(event, "concat('path ', array_join(" ~ edit ~ ".path, '.'), ' is ambiguous: the document has a field named with dots')") }}
      when {{ edit }}.op <> 'set' and exists(_cdc_cs, _cdc_c -> _cdc_c is null) then {{ doc }}
      else aggregate(reverse(sequence(0, size({{ edit }}.path) - 1)), cast(null as string),
        (_cdc_v, _cdc_i) -> case when _cdc_i = size({{ edit }}.path) - 1
          then {{ cdclake.json_edit_leaf('_cdc_cs[_cdc_i]', edit ~ '.path[_cdc_i]', edit, cannot) }}
          else {{ cdclake.json_set_child('_cdc_cs[_cdc_i]', edit ~ '.path[_cdc_i]', '_cdc_v', event, cannot) }} end)
    end), 1)
  end
{%- endmacro %}


{#- Container `c` with `edit` applied to its member `seg`. In an array (`seg` an index): 'unset' sets the element to
    null, as MongoDB's $unset does, and 'truncate' cuts the array that the element is (`m.0`). -#}
{% macro json_edit_leaf(c, seg, edit, cannot) -%}
  {%- set event = edit ~ '.event' -%}
  {%- set index = 'cast(' ~ seg ~ ' as int)' -%}
  {%- set in_array = 'left(' ~ c ~ ", 1) = '[' and " ~ seg ~ " rlike '^[0-9]{1,9}$'" -%}
  case
    when {{ edit }}.op = 'set' then {{ cdclake.json_set_child(c, seg, edit ~ '.value', event, cannot) }}
    when {{ edit }}.op = 'unset' and left({{ c }}, 1) = '{' then {{ cdclake.json_object_remove(c, seg, event) }}
    when {{ edit }}.op = 'unset' and {{ in_array }} then
      case when {{ index }} < json_array_length({{ c }}) then {{ cdclake.json_array_set(c, index, "'null'") }} else {{ c }} end
    when {{ edit }}.op = 'truncate' and (left({{ c }}, 1) = '{' or {{ in_array }}) then element_at(transform(array({{ cdclake.json_child(c, seg, event) }}), _cdc_a ->
      case when _cdc_a is null or left(_cdc_a, 1) <> '[' then {{ cannot }}
        when left({{ c }}, 1) = '{' then {{ cdclake.json_object_set(c, seg, cdclake.json_array_truncate('_cdc_a', edit ~ '.size'), event) }}
        else {{ cdclake.json_array_set(c, index, cdclake.json_array_truncate('_cdc_a', edit ~ '.size')) }} end), 1)
    else {{ cannot }} end
{%- endmacro %}


{#- Container `c` (object or array) with member `seg` set to raw JSON `v`. -#}
{% macro json_set_child(c, seg, v, event, cannot) -%}
  case
    when left({{ c }}, 1) = '{' then {{ cdclake.json_object_set(c, seg, v, event) }}
    when left({{ c }}, 1) = '[' and {{ seg }} rlike '^[0-9]{1,9}$' then {{ cdclake.json_array_set(c, 'cast(' ~ seg ~ ' as int)', v) }}
    else {{ cannot }} end
{%- endmacro %}


{#- Edits (see the header) setting every member of JSON object text `fields` (keys are dotted paths). -#}
{% macro json_set_edits(fields, event) -%}
  coalesce(transform(json_object_keys({{ fields }}), _cdc_k -> named_struct('op', 'set', 'path', split(_cdc_k, '[.]'),
    'value', {{ cdclake.json_member(fields, '_cdc_k', event) }}, 'size', cast(null as int), 'event', {{ event }})), array())
{%- endmacro %}


{#- Edits removing each dotted path of array<string> `paths`. -#}
{% macro json_unset_edits(paths, event) -%}
  coalesce(transform({{ paths }}, _cdc_k -> named_struct('op', 'unset', 'path', split(_cdc_k, '[.]'),
    'value', cast(null as string), 'size', cast(null as int), 'event', {{ event }})), array())
{%- endmacro %}


{#- One edit that fails with `why` (a SQL string expression) when it is applied. -#}
{% macro json_fail_edits(why, event) -%}
  array(named_struct('op', 'fail', 'path', array(), 'value', {{ why }}, 'size', cast(null as int), 'event', {{ event }}))
{%- endmacro %}
