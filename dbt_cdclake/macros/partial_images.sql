{#-
  Partial images, completed before net effect. Some updates carry only some columns: Oracle with PK-only
  supplemental logging (nulls for the columns the update did not touch; config ignore_null_updates=true),
  PostgreSQL's unchanged TOAST columns and Oracle's unchanged LOBs (Debezium's placeholder
  `__debezium_unavailable_value` instead of the value; config unavailable_value names another placeholder, none
  turns this off) and MongoDB without a full `after` (capture.mode change_streams: updateDescription; oplog:
  patch). Such an update
  is folded onto the key's previous image: the updates since the key's last full image (c/r, a full MongoDB
  update, or nothing after a d/t) are applied in order, on top of that image or, when the unit of work holds
  none, on top of what silver holds for the key. The bronze rows come out with `after` complete, so net effect,
  extracted columns and SCD2 history see full images only.

  Folding is by position, like everything else: silver's row (current state) or versions (history='scd2'), the
  key's tombstones and the unit's truncates join the unit's changes as images (null for deletes), and each
  update folds onto the full images before it. An update older than silver's row therefore never mixes into it.
  A MongoDB update that cannot be folded (no document before it, a path it cannot follow) fails the run, naming
  the event: never a partial or wrong document.

  A primary-key change is a delete of the old key and a create of the new one, both at the same position (or one place
  apart in their transaction: moved_delete_order_sql), and the create carries the update's partial image. Debezium
  marks the create with the `__debezium.oldkey` header and the delete with `__debezium.newkey` (bronze keeps both in
  `_cdc_headers`): the create is folded onto the old key's image before its delete (fold_moved_creates), and then
  serves as the new key's full image. A delete of an earlier unit of work is found in bronze; one still to come is
  stood in for by the old key the create's header names. A create that cannot be paired is folded like an update of
  its own key.
-#}

{% macro fold_partial_images(bronze, changes, layout, target, tombstones, delete_mode, history, probe_unavailable=true) -%}
  {{ return(adapter.dispatch('fold_partial_images', 'cdclake')(bronze, changes, layout, target, tombstones, delete_mode, history, probe_unavailable)) }}
{%- endmacro %}

{#- The relation to read the unit of work from: `changes` itself, or a table of the run with its images folded.
    `probe_unavailable`: false when bronze's counts say the unit holds no placeholder (see unavailable_free). -#}
{% macro default__fold_partial_images(bronze, changes, layout, target, tombstones, delete_mode, history, probe_unavailable=true) -%}
  {%- set ignore_nulls = config.get('ignore_null_updates', false) -%}
  {%- set placeholder = none -%}
  {#- Whether the unit can hold primary-key changes to fold (bronze keeps headers, and the model reads them). -#}
  {%- set moves = '_cdc_headers' in layout.input_columns -%}
  {%- if not layout.document -%}
    {%- set placeholder = cdclake.unavailable_placeholder_in(bronze, changes, probe_unavailable, moves) -%}
    {%- if not ignore_nulls and placeholder is none %}{{ return(changes) }}{% endif -%}
  {%- endif -%}
  {%- set types = cdclake.bronze_columns(bronze) -%}
  {%- if layout.document -%}
    {%- if ignore_nulls -%}
      {{ exceptions.raise_compiler_error("cdc_silver model '" ~ model.name ~ "': ignore_null_updates applies to typed row images; " ~ bronze ~ " holds documents, whose partial updates (updateDescription, patch) are folded without it") }}
    {%- endif -%}
    {%- if 'updateDescription' not in types and 'patch' not in types -%}
      {#- Schemaless images of another connector (JSON text): only placeholders to fold. Always looked for: bronze
          tables written before cdclake counted them in JSON text hold a count of 0 for them. -#}
      {%- set placeholder = cdclake.unavailable_document_placeholder_in(changes, moves) -%}
      {%- if placeholder is none %}{{ return(changes) }}{% endif -%}
    {%- elif run_query("select count(*) from " ~ changes ~ " where op = 'u' and after is null").rows[0][0] == 0 -%}
      {{ return(changes) }}
    {%- else -%}
      {%- set moves = false -%}  {#- MongoDB: a document's _id never changes -#}
    {%- endif -%}
  {%- endif -%}
  {%- set folded = cdclake.scratch_table(layout, 'folded') -%}
  {%- set fold = cdclake.fold_setup(bronze, changes, layout, delete_mode, history, placeholder) -%}
  {%- do fold.update({'moved_creates': moves}) -%}
  {%- set moved = cdclake.fold_moved_creates(bronze, changes, layout, types, target, tombstones, delete_mode, fold, placeholder) if moves else changes -%}
  {%- set segments = cdclake.fold_segments_sql(moved, layout, types, target, tombstones, delete_mode, fold, placeholder) -%}
  {%- set images = cdclake.fold_images_sql(moved, layout, fold, placeholder) -%}
  {% do cdclake.write_fold(folded, cdclake.scratch_table(layout, 'folding'), segments, images, layout, fold) %}
  {%- if moved != changes %}{% do run_query('drop table if exists ' ~ moved ~ ' purge') %}{% endif -%}
  {%- if layout.document -%}
    {%- set errors = run_query("select " ~ cdclake.json_error_message('after') ~ " from " ~ folded ~ " where instr(after, chr(0)) > 0 limit 1").rows -%}
    {%- if errors | length -%}
      {% do cdclake.drop_folded_images(layout) %}
      {{ exceptions.raise_database_error("cdclake: model '" ~ model.name ~ "': " ~ errors[0][0]) }}
    {%- endif -%}
  {%- endif -%}
  {{ return(folded) }}
{%- endmacro %}


{#- Writes the fold (`segments` and `images`, see fold_segments_sql) to table `folded` (`staged`: a table for its first
    half, documents), once: the folding expressions are large, and each statement that read them as a view, or as a
    cached relation (which keeps the plan it was made from), analyzed, canonicalized and printed them again for
    Spark's listeners: 30-40 s per statement on a few rows. A table reads as a scan. -#}
{% macro write_fold(folded, staged, segments, images, layout, fold) -%}
  {%- if layout.document -%}
    {#- In two statements: Spark's analyzer passes over a whole query once per level of nesting of its deepest
        expression, and a document's two large ones (the edits read from the change, their fold) come one after
        the other: analyzed apart, each pass covers only one of them (docs/silver.md, Cost). -#}
    {% do run_query('create table ' ~ staged ~ ' using iceberg as with ' ~ segments ~ ' select * from ' ~ fold.staged) %}
    {% do run_query('create table ' ~ folded ~ ' using iceberg as with ' ~ fold.staged ~ ' as (select * from ' ~ staged ~ ')' ~ (', ' if fold.staged == 'segmented' else ' ') ~ images) %}
    {% do run_query('drop table if exists ' ~ staged ~ ' purge') %}
  {%- else -%}
    {% do run_query('create table ' ~ folded ~ ' using iceberg as with ' ~ segments ~ ' ' ~ images) %}
  {%- endif -%}
{%- endmacro %}


{#- A create of the unit that Debezium sent for a primary-key change (see the header), as a condition. -#}
{% macro moved_create_sql(prefix='') -%}
  ({{ prefix }}op = 'c' and exists({{ prefix }}_cdc_headers, _cdc_h -> _cdc_h.key = '__debezium.oldkey'))
{%- endmacro %}


{#-
  The unit of work (`changes`) with each primary-key change's create folded onto the old key's image before its delete
  (a table of the run), or `changes` itself when it holds no such create with a partial image. A create is paired with
  the delete at its position in its topic (moved_delete_order_sql) that carries `__debezium.newkey` (when there is one
  such delete, and it pairs with no create of another key; otherwise the create is left as it came). The fold reads
  the create as an update of the delete's key, just before the delete (a create ranks before a delete at a position),
  and folds every version (`every`), so that it reaches the create, which is not its key's last change. A create whose
  delete landed in an earlier unit of work (a flush or a run between the two records, or another Kafka partition)
  finds it in bronze, with the old key's changes up to it (moves_from_earlier_units): silver no longer holds that key.
  One whose delete is not in bronze at all (it comes later, from another partition) pairs with the old key its header
  names (moved_old_key_sql): silver still holds that key, and its delete will remove it; the run warns, as that key's
  partition may still hold changes before the delete. A create whose old key has no image before it even so is left as
  it came, for the fold of its own key (default__fold_partial_images); one whose old key cannot be read at all is also
  said in a warning.
-#}
{% macro fold_moved_creates(bronze, changes, layout, types, target, tombstones, delete_mode, fold, placeholder) -%}
  {%- if layout.document -%}
    {%- set partial = cdclake.json_placeholder_edits_sql(placeholder, "''", 'true') ~ ' is not null' -%}
  {%- else -%}
    {%- set partial = cdclake.missing_value_sql(fold.fields, placeholder) | join(' or ') -%}
  {%- endif -%}
  {%- set connector = cdclake.transaction_reading(bronze, types).connector -%}
  {%- set creates = 'select _cdc_topic, _cdc_partition, _cdc_offset, _cdc_order, ' ~ connector ~ ' as _cdc_connector from ' ~ changes ~ ' where ' ~ cdclake.moved_create_sql() ~ ' and (' ~ partial ~ ')' -%}
  {%- set counts = run_query('select count(*), count_if(not _cdc_paired) from (select max(d._cdc_topic is not null) as _cdc_paired from (' ~ creates ~ ') c left join (' ~ cdclake.moved_deletes_sql(changes) ~ ') d on c._cdc_topic = d._cdc_topic and d._cdc_order = ' ~ cdclake.moved_delete_order_sql('c._cdc_order', 'c._cdc_connector') ~ ' group by c._cdc_topic, c._cdc_partition, c._cdc_offset)').rows[0] -%}
  {%- if counts[0] == 0 -%}
    {{ return(changes) }}
  {%- endif -%}
  {%- set state = {'current': changes, 'done': false} -%}
  {%- set augmented = cdclake.moves_from_earlier_units(bronze, changes, layout, fold, partial, connector) if counts[1] > 0 and target is not none else none -%}
  {%- set earlier = augmented is not none -%}
  {%- if earlier %}{% do state.update({'current': augmented}) %}{% endif -%}
  {#- A create whose delete is in neither (it comes later, from another partition) pairs with the old key its
      `__debezium.oldkey` header names, where that can be read (moved_old_key_sql). -#}
  {%- set header = cdclake.moved_old_key_sql(layout, changes) if counts[1] > 0 else none -%}
  {%- if counts[1] > 0 -%}
    {#- Either way the run warns: a create the header gives no key for stays partial, and one it does takes the old
        key's values as bronze holds them now, when a change of the old key before its delete may still be to
        come from the old key's partition (a --full-refresh once the deletes have landed makes both exact). -#}
    {%- set readable = header.known if header is not none else 'false' -%}
    {%- set rows = run_query('select * from (select ' ~ readable ~ ' as _cdc_readable, _cdc_topic, _cdc_partition, _cdc_offset, count(*) over (partition by ' ~ readable ~ ') as _cdc_count, row_number() over (partition by ' ~ readable ~ ' order by _cdc_topic, _cdc_partition, _cdc_offset) as _cdc_rank from (' ~ cdclake.unpaired_creates_sql(state.current, partial, connector, earlier) ~ ') u) where _cdc_rank <= 3 order by 1, 2, 3, 4').rows -%}
    {%- for folded in [false, true] -%}
      {%- set named = [] -%}
      {%- set count = [] -%}
      {%- for row in rows if row[0] == folded %}{% do named.append(row[1] ~ ' partition ' ~ row[2] ~ ' offset ' ~ row[3]) %}{% do count.append(row[4]) %}{% endfor -%}
      {%- if named -%}
        {%- set which = "cdc_silver model '" ~ model.name ~ "': " ~ count[0] ~ " primary-key change(s) in " ~ bronze ~ " (" ~ named | join('; ') ~ (', ...' if count[0] > 3 else '') ~ ") carry a partial image in their create, and the delete of the old key is not in bronze yet (it comes later, from another Kafka partition): " -%}
        {%- if folded -%}
          {% do exceptions.warn(which ~ "the creates take the values of the old key their __debezium.oldkey header names as bronze holds them now; a change of that key still to come from its partition before the delete is not in them until a --full-refresh once the deletes have landed") %}
        {%- else -%}
          {% do exceptions.warn(which ~ "their __debezium.oldkey header " ~ ('does not name all of the key columns ' ~ layout.key_columns | join(', ') if header is not none else 'cannot be read for keys of these types') ~ ", so the new key's row lacks the values the create did not carry until a full image of it lands; a --full-refresh once the deletes have landed folds them") %}
        {%- endif -%}
      {%- endif -%}
    {%- endfor -%}
  {%- endif -%}
  {%- set new_key = [] -%}
  {%- set old_key = [] -%}
  {%- for key in layout.key_columns -%}
    {%- do new_key.append(layout.key_exprs[key]) -%}
    {%- do old_key.append(', d._cdc_moved_fk' ~ loop.index0) -%}
  {%- endfor -%}
  {%- set new_key, old_key = new_key | join(', '), old_key | join('') -%}
  {#- In rounds: a key changed twice in one unit (1 -> 5 -> 6) folds 6's create onto 5's, once 5's is folded. -#}
  {%- set done = cdclake.scratch_table(layout, 'moves_done') -%}
  {%- for round in range(8) -%}
    {%- set pairs = cdclake.scratch_table(layout, 'moves') -%}
    {%- set creates = 'select _cdc_topic, _cdc_partition, _cdc_offset, _cdc_order, ' ~ connector ~ ' as _cdc_connector, struct(' ~ new_key ~ ') as _cdc_new_key from ' ~ state.current ~ ' where ' ~ cdclake.moved_create_sql() ~ ' and (' ~ partial ~ ')' -%}
    {%- if state.done %}{% set creates = 'select * from (' ~ creates ~ ') x left anti join ' ~ done ~ ' y on x._cdc_topic = y._cdc_topic and x._cdc_partition = y._cdc_partition and x._cdc_offset = y._cdc_offset' %}{% endif -%}
    {#- Pairs by old and new key, not by record: copies of a change (at-least-once replays) pair as one. -#}
    {% do run_query('create table ' ~ pairs ~ ' using iceberg as select * from ('
      ~ 'select c._cdc_topic as _cdc_moved_topic, c._cdc_partition as _cdc_moved_partition, c._cdc_offset as _cdc_moved_offset, d.*,'
      ~ ' count(*) over (partition by c._cdc_topic, c._cdc_partition, c._cdc_offset) as _cdc_deletes,'
      ~ ' size(collect_set(c._cdc_new_key) over (partition by d._cdc_delete_topic, d._cdc_delete_order' ~ old_key ~ ')) as _cdc_creates'
      ~ ' from (' ~ creates ~ ') c'
      ~ ' join (select distinct _cdc_topic as _cdc_delete_topic, _cdc_order as _cdc_delete_order'
      ~ cdclake.moved_keys_sql(layout) ~ ' from ' ~ state.current ~ ' where ' ~ cdclake.moved_delete_sql() ~ ') d'
      ~ ' on d._cdc_delete_topic = c._cdc_topic and d._cdc_delete_order = ' ~ cdclake.moved_delete_order_sql('c._cdc_order', 'c._cdc_connector')
      ~ ') where _cdc_deletes = 1 and _cdc_creates = 1'
      ~ (' union all select u._cdc_topic, u._cdc_partition, u._cdc_offset, u._cdc_topic, u._cdc_order' ~ header.select ~ ', 1, 1 from (' ~ cdclake.unpaired_creates_sql(state.current, partial, connector, earlier) ~ ') u'
        ~ (' left anti join ' ~ done ~ ' y on u._cdc_topic = y._cdc_topic and u._cdc_partition = y._cdc_partition and u._cdc_offset = y._cdc_offset' if state.done else '')
        ~ ' where ' ~ header.known if header is not none else '')) %}
    {%- set paired = run_query('select count(*) from ' ~ pairs).rows[0][0] -%}
    {%- if paired == 0 -%}
      {% do run_query('drop table if exists ' ~ pairs ~ ' purge') %}
      {% break %}
    {%- endif -%}
    {%- set moving = {} -%}
    {%- do moving.update(fold) -%}
    {%- do moving.update({'every': true, 'staged': 'segmented' if layout.document else 'folded', 'moves': pairs}) -%}
    {%- set folded = cdclake.scratch_table(layout, 'moves_folded') -%}
    {%- set segments = cdclake.fold_segments_sql(state.current, layout, types, target, tombstones, delete_mode, moving, placeholder) -%}
    {% do cdclake.write_fold(folded, cdclake.scratch_table(layout, 'moves_folding'), segments, cdclake.fold_images_sql(state.current, layout, moving, placeholder), layout, moving) %}
    {%- set moved = cdclake.scratch_table(layout, 'moved' ~ round) -%}
    {%- set matched = ' on m._cdc_moved_offset is not null and f._cdc_topic = m._cdc_moved_topic and f._cdc_partition = m._cdc_moved_partition and f._cdc_offset = m._cdc_moved_offset' -%}
    {% do run_query('create table ' ~ moved ~ ' using iceberg as select '
      ~ cdclake.columns_with_after(fold.columns, 'c.', 'case when f._cdc_based then f.after else c.after end')
      ~ (', c._cdc_earlier' if earlier else '')
      ~ ' from ' ~ state.current ~ ' c left join ' ~ pairs ~ ' m on c._cdc_topic = m._cdc_moved_topic and c._cdc_partition = m._cdc_moved_partition and c._cdc_offset = m._cdc_moved_offset'
      ~ ' left join ' ~ folded ~ ' f' ~ matched) %}
    {%- set resolved = 'select f._cdc_topic, f._cdc_partition, f._cdc_offset from ' ~ pairs ~ ' m join ' ~ folded ~ ' f' ~ matched ~ ' where f._cdc_based' -%}
    {% do run_query(('insert into ' ~ done ~ ' ' if state.done else 'create table ' ~ done ~ ' using iceberg as ') ~ resolved) %}
    {%- set folded_now = run_query('select count(*) from (' ~ resolved ~ ')').rows[0][0] -%}
    {% do run_query('drop table if exists ' ~ folded ~ ' purge') %}
    {% do run_query('drop table if exists ' ~ pairs ~ ' purge') %}
    {%- if state.current != changes %}{% do run_query('drop table if exists ' ~ state.current ~ ' purge') %}{% endif -%}
    {%- do state.update({'current': moved, 'done': true}) -%}
    {%- if folded_now == 0 or folded_now == paired %}{% break %}{% endif -%}
  {%- endfor -%}
  {% do run_query('drop table if exists ' ~ done ~ ' purge') %}
  {%- if earlier and state.current == augmented -%}
    {#- Nothing paired, even with the deletes of earlier units: the unit as it came. -#}
    {% do run_query('drop table if exists ' ~ augmented ~ ' purge') %}
    {{ return(changes) }}
  {%- elif earlier -%}
    {#- The rows of earlier units served as images; the unit's own rows go on. -#}
    {%- set unit = cdclake.scratch_table(layout, 'moved') -%}
    {% do run_query('create table ' ~ unit ~ ' using iceberg as select ' ~ cdclake.columns_with_after(fold.columns, '', 'after') ~ ' from ' ~ state.current ~ ' where not _cdc_earlier') %}
    {% do run_query('drop table if exists ' ~ state.current ~ ' purge') %}
    {{ return(unit) }}
  {%- endif -%}
  {{ return(state.current) }}
{%- endmacro %}


{#-
  The unit of work (`changes`) and, marked `_cdc_earlier`, the bronze rows that fold_moved_creates needs from
  earlier units for the unit's primary-key changes' creates with a partial image (`partial`) whose delete is not in
  the unit: each such delete (same topic and position, `__debezium.newkey`) and the changes of its key up to it,
  which hold the old key's values. When those hold such a create in turn (1 -> 2 in one unit, 2 -> 4 split across
  the next two), its delete and old key's changes are read too, and so on (`_cdc_step`: the read that added a row).
  A table of the run, or none when bronze holds none of those deletes. Only runs that hold such a create read all
  of bronze.
-#}
{% macro moves_from_earlier_units(bronze, changes, layout, fold, partial, connector) -%}
  {%- set augmented = cdclake.scratch_table(layout, 'moves_earlier') -%}
  {%- set columns = [] -%}
  {%- for column in fold.columns %}{% do columns.append(cdclake.quote(column)) %}{% endfor -%}
  {%- set columns = columns | join(', ') -%}
  {%- set keys = [] -%}
  {%- set key_names = [] -%}
  {%- for key in layout.key_columns -%}
    {%- do keys.append('b._cdc_hk' ~ loop.index0 ~ ' <=> d._cdc_hk' ~ loop.index0) -%}
    {%- do key_names.append(', _cdc_hk' ~ loop.index0) -%}
  {%- endfor -%}
  {%- set history = 'select *' ~ cdclake.moved_keys_sql(layout, '_cdc_hk') ~ ' from ' ~ bronze ~ cdclake.kept_changes_filter() -%}
  {% do run_query('create table ' ~ augmented ~ ' using iceberg as select ' ~ columns ~ ', false as _cdc_earlier, 0 as _cdc_step from ' ~ changes) %}
  {%- set wanted = {'sql': 'select distinct _cdc_topic, _cdc_order, _cdc_connector from (' ~ cdclake.unpaired_creates_sql(changes, partial, connector) ~ ') c'} -%}
  {%- for step in range(1, 9) -%}
    {% do run_query('insert into ' ~ augmented ~ ' with '
      ~ 'history as (' ~ history ~ '), '
      ~ 'deletes as (select b._cdc_topic, b._cdc_order' ~ key_names | join('') ~ ' from history b left semi join (' ~ wanted.sql ~ ') w on b._cdc_topic = w._cdc_topic and b._cdc_order = ' ~ cdclake.moved_delete_order_sql('w._cdc_order', 'w._cdc_connector') ~ ' where ' ~ cdclake.moved_delete_sql('b.') ~ ') '
      ~ 'select ' ~ columns ~ ', true, ' ~ step ~ ' from (select b.* from history b left semi join deletes d on b._cdc_topic = d._cdc_topic and b._cdc_order <= d._cdc_order'
      ~ (' and ' ~ keys | join(' and ') if keys else '') ~ ') h left anti join ' ~ augmented ~ ' u on h._cdc_topic = u._cdc_topic and h._cdc_partition = u._cdc_partition and h._cdc_offset = u._cdc_offset') %}
    {#- The creates this read added whose delete is not read yet: their old keys' values are wanted next. -#}
    {%- do wanted.update({'sql': 'select distinct _cdc_topic, _cdc_order, _cdc_connector from (' ~ cdclake.unpaired_creates_sql(augmented, partial, connector) ~ ') c where _cdc_step = ' ~ step}) -%}
    {%- if run_query('select count(*) from (' ~ wanted.sql ~ ')').rows[0][0] == 0 %}{% break %}{% endif -%}
  {%- endfor -%}
  {%- if run_query('select count(*) from ' ~ augmented ~ ' where _cdc_earlier').rows[0][0] == 0 -%}
    {% do run_query('drop table if exists ' ~ augmented ~ ' purge') %}
    {{ return(none) }}
  {%- endif -%}
  {{ return(augmented) }}
{%- endmacro %}


{#- The rows of `relation` that are primary-key changes' creates with a partial image (`partial`, a condition) whose
    delete is not in `relation` (`earlier`: of the unit, not of the rows moves_from_earlier_units added). -#}
{% macro unpaired_creates_sql(relation, partial, connector, earlier=false) -%}
  select c.* from (select *, {{ connector }} as _cdc_connector from {{ relation }}) c left anti join ({{ cdclake.moved_deletes_sql(relation) }}) d
    on c._cdc_topic = d._cdc_topic and d._cdc_order = {{ cdclake.moved_delete_order_sql('c._cdc_order', 'c._cdc_connector') }}
  where {{ cdclake.moved_create_sql('c.') }} and ({{ partial }}){{ ' and not c._cdc_earlier' if earlier else '' }}
{%- endmacro %}


{#- The positions of the primary-key changes' deletes in `relation`, as (_cdc_topic, _cdc_order). -#}
{% macro moved_deletes_sql(relation) -%}
  select distinct _cdc_topic, _cdc_order from {{ relation }} where {{ cdclake.moved_delete_sql() }}
{%- endmacro %}


{#-
  The old key of a primary-key change's create, read from its `__debezium.oldkey` header: {'select': the key columns
  as a select list's tail (`_cdc_moved_fk<i>`, typed as the key columns of `changes`), 'known': the condition that
  the header names every one}, or none when a key column's type has no single JSON form (only integers, text and
  booleans do: Debezium writes a date, a time or a decimal in one of several forms its settings choose).
  The header holds the key as Kafka Connect's header converter wrote it: the default (SimpleHeaderConverter) writes
  a struct as a JSON object, the JSON converter as one with its schema (`{"schema": ..., "payload": {...}}`).
  Field names are matched without regard to case, as the model's key columns are.
-#}
{% macro moved_old_key_sql(layout, changes) -%}
  {%- set probes = [] -%}
  {%- for key in layout.key_columns %}{% do probes.append('typeof(' ~ layout.key_exprs[key] ~ ')') %}{% endfor -%}
  {%- set types = run_query('select ' ~ probes | join(', ') ~ ' from ' ~ changes ~ ' limit 1').rows[0] -%}
  {%- set value = "cast(element_at(filter(_cdc_headers, _cdc_h -> _cdc_h.key = '__debezium.oldkey'), 1).value as string)" -%}
  {%- set object = "case when get_json_object(" ~ value ~ ", '$.schema') is not null and get_json_object(" ~ value ~ ", '$.payload') is not null then get_json_object(" ~ value ~ ", '$.payload') else " ~ value ~ " end" -%}
  {%- set fields = "transform_keys(from_json(" ~ object ~ ", 'map<string,string>'), (_cdc_k, _cdc_v) -> lower(_cdc_k))" -%}
  {%- set keys = [] -%}
  {%- set known = [] -%}
  {%- for key in layout.key_columns -%}
    {%- if types[loop.index0] not in ['tinyint', 'smallint', 'int', 'bigint', 'string', 'boolean'] %}{{ return(none) }}{% endif -%}
    {%- set part = 'cast(' ~ fields ~ '[' ~ cdclake.sql_string(key | lower) ~ '] as ' ~ types[loop.index0] ~ ')' -%}
    {%- do keys.append(', ' ~ part ~ ' as _cdc_moved_fk' ~ loop.index0) -%}
    {%- do known.append(part ~ ' is not null') -%}
  {%- endfor -%}
  {{ return({'select': keys | join(''), 'known': known | join(' and ')}) }}
{%- endmacro %}


{#- The position (`_cdc_order`) of the delete that Debezium sent with a primary-key change's create (its
    `_cdc_order`, and its connector as `source.connector` names it): the create's own, which for Oracle and Informix
    with provide.transaction.metadata ends in the event's place in its transaction (ingest's TRANSACTION_ORDERED;
    from 1, -1 without the metadata), where the delete is one place before the create. Joined with equality. -#}
{% macro moved_delete_order_sql(create_order, connector) -%}
  case when coalesce({{ connector }} in ('oracle', 'informix'), false) and element_at({{ create_order }}, -1) > 1
    then concat(slice({{ create_order }}, 1, size({{ create_order }}) - 1), array(element_at({{ create_order }}, -1) - 1))
    else {{ create_order }} end
{%- endmacro %}


{#- A delete of the unit that Debezium sent for a primary-key change (see moved_create_sql), as a condition. -#}
{% macro moved_delete_sql(prefix='') -%}
  ({{ prefix }}op = 'd' and exists({{ prefix }}_cdc_headers, _cdc_h -> _cdc_h.key = '__debezium.newkey'))
{%- endmacro %}


{#- The key columns of a bronze row (a moved create's delete: its old key), named `<name><i>`, as a select list's
    tail. -#}
{% macro moved_keys_sql(layout, name='_cdc_moved_fk') -%}
  {%- for key in layout.key_columns %}, {{ layout.key_exprs[key] }} as {{ name }}{{ loop.index0 }}{% endfor -%}
{%- endmacro %}


{#- `columns` (of a bronze row `prefix`) as a select list, with `after` computed by `after`. -#}
{% macro columns_with_after(columns, prefix, after) -%}
  {%- for column in columns %}{% if column == 'after' %}{{ after }}{% else %}{{ prefix }}{{ cdclake.quote(column) }}{% endif %} as {{ cdclake.quote(column) }}{% if not loop.last %}, {% endif %}{% endfor -%}
{%- endmacro %}


{#- Per field of a typed image, the condition that a change does not carry its value: the placeholder, or a null
    with ignore_null_updates. -#}
{% macro missing_value_sql(fields, placeholder) -%}
  {%- set conditions = [] -%}
  {%- for field in fields -%}
    {%- set missing = [] -%}
    {%- if config.get('ignore_null_updates', false) %}{% do missing.append('after.' ~ cdclake.quote(field) ~ ' is null') %}{% endif -%}
    {%- if placeholder is not none %}{% do missing.append(cdclake.unavailable_sql(field, placeholder)) %}{% endif -%}
    {%- do conditions.append('(' ~ missing | join(' or ') ~ ')') -%}
  {%- endfor -%}
  {{ return(conditions) }}
{%- endmacro %}


{#- The placeholder (config unavailable_value) when the unit of work holds it in an update's text, bytes or text
    array column, else none: bronze's counts rule it out (`probe`: false; only for Debezium's default placeholder,
    which is what `cdclake ingest` counts) or a query over the updates (`moves`: and primary-key changes' creates)
    finds none. (Not decided from the type of `after` that `describe` prints: Spark cuts a wide struct's type short.) -#}
{% macro unavailable_placeholder_in(bronze, changes, probe, moves=false) -%}
  {%- set placeholder = cdclake.configured_placeholder() -%}
  {%- if placeholder is none or (not probe and placeholder == '__debezium_unavailable_value') %}{{ return(none) }}{% endif -%}
  {%- set fields = cdclake.struct_field_names(bronze, 'after') -%}
  {%- set found = run_query("select count(*) from " ~ changes ~ " where " ~ cdclake.partial_change_sql(moves) ~ " and (" ~ cdclake.unavailable_any_sql(fields, placeholder) ~ ")").rows[0][0] -%}
  {{ return(placeholder if found > 0 else none) }}
{%- endmacro %}

{#- The placeholder when an update's JSON text image (schemaless bronze) may hold it, else none: a cheap text
    search for each form json_placeholder_forms_sql lists. Each member is checked when folding. -#}
{% macro unavailable_document_placeholder_in(changes, moves=false) -%}
  {%- set placeholder = cdclake.configured_placeholder() -%}
  {%- if placeholder is none %}{{ return(none) }}{% endif -%}
  {%- set found = run_query("select count(*) from " ~ changes ~ " where " ~ cdclake.partial_change_sql(moves) ~ " and exists(array(" ~ cdclake.json_placeholder_forms_sql(placeholder) ~ "), _cdc_f -> instr(after, _cdc_f) > 0)").rows[0][0] -%}
  {{ return(placeholder if found > 0 else none) }}
{%- endmacro %}

{#- The changes whose image may be partial: updates and (`moves`) primary-key changes' creates, as a condition. -#}
{% macro partial_change_sql(moves, prefix='') -%}
  {{ "(" ~ prefix ~ "op = 'u' or " ~ cdclake.moved_create_sql(prefix) ~ ")" if moves else prefix ~ "op = 'u'" }}
{%- endmacro %}

{#- The model's placeholder (config unavailable_value; Debezium's default), none when folding it is turned off. -#}
{% macro configured_placeholder() -%}
  {{ return(config.get('unavailable_value', '__debezium_unavailable_value')) }}
{%- endmacro %}


{#- The placeholder's bytes as decimal numbers (array<string>): how Debezium fills an integer array (DBZ-5936). -#}
{% macro placeholder_bytes_sql(literal) -%}
  transform(sequence(0, octet_length({{ literal }}) - 1), _cdc_i -> conv(substr(hex(encode({{ literal }}, 'UTF-8')), 2 * _cdc_i + 1, 2), 16, 10))
{%- endmacro %}

{#- The UUID Java's UUID.nameUUIDFromBytes makes of the placeholder's bytes: what Debezium puts in a uuid array
    (DBZ-6720; b68a35a7-17ad-35b3-af2a-ae46edb4545a for the default placeholder). -#}
{% macro placeholder_uuid_sql(literal) -%}
  {%- set h = "md5(encode(" ~ literal ~ ", 'UTF-8'))" -%}
  concat(substr({{ h }}, 1, 8), '-', substr({{ h }}, 9, 4), '-3', substr({{ h }}, 14, 3), '-',
    lpad(lower(hex((cast(conv(substr({{ h }}, 17, 2), 16, 10) as int) & 63) | 128)), 2, '0'), substr({{ h }}, 19, 2), '-', substr({{ h }}, 21, 12))
{%- endmacro %}

{#- The placeholder as raw JSON: a JSON string, or (`bytes`) the JSON string of its bytes in base64. -#}
{% macro json_placeholder_sql(placeholder, bytes=false) -%}
  {%- set literal = cdclake.sql_string(placeholder) -%}
  {%- set text = "base64(encode(" ~ literal ~ ", 'UTF-8'))" if bytes else literal -%}
  {{ cdclake.json_quoted(text) }}
{%- endmacro %}

{#- The hstore placeholder (DBZ-7582), a map of the placeholder to itself, as JSON text: what Debezium writes for an
    hstore with hstore.handling.mode=json (its default), and the map's JSON with mode map. -#}
{% macro placeholder_hstore_json_sql(literal) -%}
  to_json(map({{ literal }}, {{ literal }}))
{%- endmacro %}

{#- The placeholder's forms as raw JSON in a schemaless image, a comma-separated SQL list: its text, its bytes in
    base64, a text array of it, an integer array of its bytes, a uuid array of its UUID, an hstore's JSON text (a
    string) or map (an object). -#}
{% macro json_placeholder_forms_sql(placeholder) -%}
  {%- set literal = cdclake.sql_string(placeholder) -%}
  {{ cdclake.json_placeholder_sql(placeholder) }}, {{ cdclake.json_placeholder_sql(placeholder, true) }},
    concat('[', {{ cdclake.json_placeholder_sql(placeholder) }}, ']'),
    concat('[', array_join({{ cdclake.placeholder_bytes_sql(literal) }}, ','), ']'),
    concat('["', {{ cdclake.placeholder_uuid_sql(literal) }}, '"]'),
    {{ cdclake.json_quoted(cdclake.placeholder_hstore_json_sql(literal)) }}, {{ cdclake.placeholder_hstore_json_sql(literal) }}
{%- endmacro %}

{#- Whether raw JSON `member` of a schemaless image is the placeholder, in one of its forms. -#}
{% macro json_is_placeholder_sql(member, placeholder) -%}
  {{ member }} in ({{ cdclake.json_placeholder_forms_sql(placeholder) }})
{%- endmacro %}

{#- Edits (json_documents.sql) of a schemaless update whose image holds the placeholder: set every other member,
    each a top-level key (a column name, never a dotted path), then keep only the image's keys (a column the source
    dropped since the earlier image goes, as with a full image); null when it holds none (a full image) or is not
    `partial` (a condition: an update, or a moved create, see fold_moved_creates). -#}
{% macro json_placeholder_edits_sql(placeholder, event, partial="op = 'u'") -%}
  case when {{ partial }} and left(trim(after), 1) = '{'
      and exists(json_object_keys(after), _cdc_k -> {{ cdclake.json_is_placeholder_sql(cdclake.json_member('after', '_cdc_k', event), placeholder) }})
    then concat(transform(filter(json_object_keys(after), _cdc_k -> not ({{ cdclake.json_is_placeholder_sql(cdclake.json_member('after', '_cdc_k', event), placeholder) }})),
      _cdc_k -> named_struct('op', 'set', 'path', array(_cdc_k), 'value', {{ cdclake.json_member('after', '_cdc_k', event) }},
        'size', cast(null as int), 'event', {{ event }})),
      array(named_struct('op', 'project', 'path', json_object_keys(after), 'value', cast(null as string),
        'size', cast(null as int), 'event', {{ event }})))
  end
{%- endmacro %}

{#- Whether image field `field` of a bronze row holds `placeholder`, as Debezium writes it for each type: the text,
    bytes of the text, a text array of it, an integer array of its bytes, a uuid array of its UUID, an hstore's JSON
    text or map (DBZ-7582); compared as Spark's text of the value. -#}
{% macro unavailable_sql(field, placeholder) -%}
  {%- set literal = cdclake.sql_string(placeholder) -%}
  cast(after.{{ cdclake.quote(field) }} as string) in ({{ literal }}, concat('[', {{ literal }}, ']'),
    concat('[', array_join({{ cdclake.placeholder_bytes_sql(literal) }}, ', '), ']'), concat('[', {{ cdclake.placeholder_uuid_sql(literal) }}, ']'),
    {{ cdclake.placeholder_hstore_json_sql(literal) }}, concat('{', {{ literal }}, ' -> ', {{ literal }}, '}'))
{%- endmacro %}

{% macro unavailable_any_sql(fields, placeholder) -%}
  {%- for field in fields %}{{ cdclake.unavailable_sql(field, placeholder) }}{% if not loop.last %} or {% endif %}{% endfor -%}
{%- endmacro %}


{#- Drops the folded table; with `relation` (what fold_partial_images returned), only if that is it. -#}
{% macro drop_folded_images(layout, relation=none) -%}
  {%- set folded = cdclake.scratch_table(layout, 'folded') -%}
  {%- if relation is none or relation == folded -%}
    {% do run_query('drop table if exists ' ~ folded ~ ' purge') %}
  {%- endif -%}
{%- endmacro %}


{#- What the fold's SQL derives from the model: `changes`' columns, the image's fields (typed images), the key
    columns' names in the fold, and which folds it needs: `every`, since current state needs the fold of each
    key's last change only, while history needs every version's, and so do soft deletes (a winning delete keeps
    the values of the key's last change before it, net_effect_sql); `pre_image`, for MongoDB's *_with_pre_image
    capture modes, where an update's `before` is the whole document before it (documents folding placeholders
    keep theirs: an image's `before` is not its previous value there). -#}
{% macro fold_setup(bronze, changes, layout, delete_mode, history, placeholder) -%}
  {%- set columns = run_query('select * from ' ~ changes ~ ' where false').column_names -%}
  {%- set partition = [] -%}
  {%- for key in layout.key_columns %}{% do partition.append('_cdc_fk' ~ loop.index0) %}{% endfor -%}
  {%- set every = history == 'scd2' or delete_mode == 'soft' -%}
  {{ return({
      'columns': columns, 'fields': [] if layout.document else cdclake.struct_field_names(bronze, 'after'),
      'partition': partition, 'scd2': history == 'scd2', 'every': every,
      'pre_image': layout.document and placeholder is none and 'before' in columns,
      'staged': 'segmented' if layout.document and every else 'folded'}) }}
{%- endmacro %}


{#- The fold in SQL (`fold`: fold_setup), in two parts: fold_segments_sql gives the common table expressions up to
    `fold.staged`: `segmented` (the unit's changes and the keys' prior states as images, in segments that each
    start with a full image) and, unless every version of a document is folded, `folded` (each row with what its
    segment holds); fold_images_sql the ones after it and the query: the unit's rows with `after` folded. -#}
{% macro fold_segments_sql(changes, layout, types, target, tombstones, delete_mode, fold, placeholder=none) -%}
  {%- set columns, fields, partition, scd2 = fold.columns, fold.fields, fold.partition, fold.scd2 -%}
  {#- fold.moves (fold_moved_creates): the table pairing primary-key changes' creates with their old keys;
      fold.moved_creates: primary-key changes' creates may carry a partial image, like updates. -#}
  {%- set moves = fold.get('moves') -%}
  {%- set partial = "(op = 'u' or _cdc_m._cdc_moved_offset is not null)" if moves else cdclake.partial_change_sql(fold.get('moved_creates', false)) -%}
unit as (
  select
    struct({% for column in columns %}{{ cdclake.quote(column) }}{% if not loop.last %}, {% endif %}{% endfor %}) as _cdc_row,
    {%- for key in layout.key_columns %}
    {%- if moves %}
    case when _cdc_m._cdc_moved_offset is null then {{ layout.key_exprs[key] }} else _cdc_m._cdc_moved_fk{{ loop.index0 }} end as _cdc_fk{{ loop.index0 }},
    {%- else %}
    {{ layout.key_exprs[key] }} as _cdc_fk{{ loop.index0 }},
    {%- endif %}
    {%- endfor %}
    {#- A primary-key change's create folds as an update of the old key just before its delete: at the delete's
        position (moved_delete_order_sql: Oracle's and Informix's can be the create's less one place). #}
    named_struct('o', {{ 'coalesce(_cdc_m._cdc_delete_order, _cdc_order)' if moves else '_cdc_order' }}, 'r', {{ cdclake.op_rank('op') }}, 'f', _cdc_offset, 'p', 1) as _cdc_pos,
    {%- if layout.document and placeholder is not none %}
    after as _cdc_doc,
    {{ cdclake.json_placeholder_edits_sql(placeholder, cdclake.change_event_sql(''), partial) }} as _cdc_edits
    {%- elif layout.document %}
    {{ cdclake.document_image_sql(types) }} as _cdc_doc,
    {{ cdclake.document_edits_sql(types, cdclake.change_event_sql('')) }} as _cdc_edits
    {%- else %}
    {#- Each image value as struct(v): null when the update does not carry it (folded from the image before),
        so that a null the update does carry stays a value. -#}
    {%- set missing = cdclake.missing_value_sql(fields, placeholder) -%}
    {%- for field in fields %}
    case when {{ partial }} and {{ missing[loop.index0] }} then null else named_struct('v', after.{{ cdclake.quote(field) }}) end as _cdc_v{{ loop.index0 }},
    {%- endfor %}
    not {{ partial }} as _cdc_full
    {%- endif %}
  from {{ changes }}
  {%- if moves %}
  left join {{ moves }} _cdc_m on _cdc_topic = _cdc_m._cdc_moved_topic and _cdc_partition = _cdc_m._cdc_moved_partition and _cdc_offset = _cdc_m._cdc_moved_offset
  {%- endif %}
  where op in ('c', 'u', 'd', 'r')
),
touched as (
  select distinct {{ partition | join(', ') }} from unit
),
events as (
  select {{ partition | join(', ') }}, _cdc_pos, _cdc_row,
    {#- A change with edits is partial: its own document (if any) is not a base to fold onto. -#}
    {%- if layout.document %} _cdc_edits is null as _cdc_full, case when _cdc_edits is null then _cdc_doc end as _cdc_doc, _cdc_edits{% else %} _cdc_full{% for field in fields %}, _cdc_v{{ loop.index0 }}{% endfor %}{% endif %}
  from unit
  {%- if target is not none %}
  union all
  select {% for key in layout.key_columns %}s.{{ cdclake.quote(key) }}, {% endfor -%}
    named_struct('o', s.{{ '_cdc_valid_from' if scd2 else '_cdc_order' }}, 'r', {{ cdclake.op_rank('s._cdc_op') }}, 'f', s._cdc_offset, 'p', 0), null, true,
    {{ cdclake.prior_image_sql(layout, fields, 's', "s._cdc_op in ('d', 't')") }}
  from {{ target }} s
  left semi join touched k on {% for key in layout.key_columns %}s.{{ cdclake.quote(key) }} <=> k._cdc_fk{{ loop.index0 }}{% if not loop.last %} and {% endif %}{% endfor %}
  {%- if delete_mode == 'hard' %}
  union all
  select {% for key in layout.key_columns %}b.{{ cdclake.quote(key) }}, {% endfor -%}
    named_struct('o', b._cdc_order, 'r', {{ cdclake.op_rank('b._cdc_op') }}, 'f', b._cdc_offset, 'p', 0), null, true,
    {{ cdclake.prior_image_sql(layout, fields) }}
  from {{ tombstones }} b
  left semi join touched k on {% for key in layout.key_columns %}b.{{ cdclake.quote(key) }} <=> k._cdc_fk{{ loop.index0 }}{% if not loop.last %} and {% endif %}{% endfor %}
  {%- endif %}
  {%- endif %}
  union all
  select {% for name in partition %}k.{{ name }}, {% endfor %}t._cdc_pos, null, true,
    {{ cdclake.prior_image_sql(layout, fields) }}
  from touched k
  cross join (select named_struct('o', _cdc_order, 'r', 4, 'f', _cdc_offset, 'p', 0) as _cdc_pos from {{ changes }} where op = 't') t
),
segmented as (
  select *,
    sum(case when _cdc_full then 1 else 0 end) over (partition by {{ partition | join(', ') }} order by _cdc_pos rows between unbounded preceding and current row) as _cdc_segment,
    max(_cdc_pos) over (partition by {{ partition | join(', ') }}) as _cdc_last,
    {#- The newest prior state (silver's row, a tombstone, a truncate): a change older than it cannot apply. -#}
    max(case when _cdc_pos.p = 0 then _cdc_pos end) over (partition by {{ partition | join(', ') }}) as _cdc_floor
  from events
)
{%- if not (layout.document and fold.every) %},
{#- Each row with what its segment holds before it (typed images: each value's last carried one) or, documents, in
    all (the base to fold onto and the segment's edits in order: only its last change is folded). #}
folded as (
  select _cdc_row, _cdc_full, _cdc_pos, _cdc_last, _cdc_floor, _cdc_segment,
    {%- if layout.document %}
    _cdc_doc,
    first_value(_cdc_doc) over segment as _cdc_base,
    {%- if fold.pre_image %}
    {#- A segment without a full image (its first row is an update, not a prior state): the first update's
        pre-image is its base. #}
    first_value(_cdc_row.before) over segment as _cdc_pre_image,
    {%- endif %}
    flatten(transform(sort_array(collect_list(case when not _cdc_full then struct(_cdc_pos, _cdc_edits) end) over segment),
      _cdc_p -> _cdc_p._cdc_edits)) as _cdc_edit_list
    {%- else %}
    {%- for field in fields %}
    last_value(_cdc_v{{ loop.index0 }}, true) over segment as _cdc_v{{ loop.index0 }}{% if not loop.last %},{% endif %}
    {%- endfor %}
    {%- endif %}
  from segmented
  window segment as (partition by {{ partition | join(', ') }}, _cdc_segment order by _cdc_pos rows between unbounded preceding and {{ 'unbounded following' if layout.document else 'current row' }})
)
{%- endif %}
{%- endmacro %}


{% macro fold_images_sql(changes, layout, fold, placeholder=none) -%}
  {%- set columns, fields, partition, scd2, every, pre_image = fold.columns, fold.fields, fold.partition, fold.scd2, fold.every, fold.pre_image -%}
{%- if layout.document and every %}
{#- Every version's document: folded once per segment, each update's document kept on the way (folding each row's
    own prefix of the segment would apply n(n+1)/2 edits to a document updated n times in one unit). -#}
segment_folds as (
  select {{ partition | join(', ') }}, _cdc_segment, _cdc_base,{% if pre_image %} _cdc_pre_image,{% endif %}
    aggregate(_cdc_patches, named_struct('d', {{ cdclake.fold_start_sql(pre_image, placeholder is not none) }}, 'ds', cast(array() as array<string>)),
      (_cdc_acc, _cdc_p) -> element_at(transform(array({{ cdclake.fold_edits_sql('_cdc_p._cdc_edits', '_cdc_acc.d') }}),
        _cdc_d -> named_struct('d', _cdc_d, 'ds', concat(_cdc_acc.ds, array(_cdc_d)))), 1)).ds as _cdc_folds
  from (
    select {{ partition | join(', ') }}, _cdc_segment, min_by(_cdc_doc, _cdc_pos) as _cdc_base,
      {%- if pre_image %} min_by(_cdc_row.before, _cdc_pos) as _cdc_pre_image,{% endif %}
      sort_array(collect_list(case when not _cdc_full then struct(_cdc_pos, _cdc_edits) end)) as _cdc_patches
    from segmented
    group by {{ partition | join(', ') }}, _cdc_segment
  )
),
folded as (
  select s._cdc_row, s._cdc_full, s._cdc_pos, s._cdc_last, s._cdc_floor, s._cdc_segment, s._cdc_doc, f._cdc_base,
    {%- if pre_image %} f._cdc_pre_image,{% endif %}
    case when not s._cdc_full then f._cdc_folds[s._cdc_patch - 1] end as _cdc_folded
  from (
    select *, count(case when not _cdc_full then 1 end) over (partition by {{ partition | join(', ') }}, _cdc_segment
      order by _cdc_pos rows between unbounded preceding and current row) as _cdc_patch
    from segmented
  ) s
  join segment_folds f on {% for name in partition %}s.{{ name }} <=> f.{{ name }} and {% endfor %}s._cdc_segment = f._cdc_segment
)
{%- endif %}
{%- if fold.get('moves') %}
{#- fold_moved_creates: each change's coordinates, its folded image, and whether that image had anything to fold
    onto (a full image or a prior state before it in its chain). #}
select _cdc_row._cdc_topic, _cdc_row._cdc_partition, _cdc_row._cdc_offset,
  {{ cdclake.folded_image_sql(layout, fields, every, placeholder is not none, not scd2, pre_image, 'true') }} as after,
  _cdc_segment > 0 as _cdc_based
from folded
where _cdc_row is not null
{%- else %}
select
  {%- for column in columns %}
  {% if column == 'after' %}{{ cdclake.folded_image_sql(layout, fields, every, placeholder is not none, not scd2, pre_image, cdclake.partial_change_sql(fold.get('moved_creates', false), '_cdc_row.')) }}{% else %}_cdc_row.{{ cdclake.quote(column) }}{% endif %} as {{ cdclake.quote(column) }}{% if not loop.last %},{% endif %}
  {%- endfor %}
from folded
where _cdc_row is not null
union all
select * from {{ changes }} where op is null or op not in ('c', 'u', 'd', 'r')
{%- endif %}
{%- endmacro %}


{#- The image columns of a prior state row in the shape of `events`: those of silver row `alias` (null when
    `deleted`), or all null (tombstones, truncates) without one. Silver names key columns after the key and keeps
    only the image columns it was asked to. -#}
{% macro prior_image_sql(layout, fields, alias=none, deleted='false') -%}
  {%- if layout.document -%}
    {%- if alias is none %}cast(null as string), null{% else %}case when {{ deleted }} then null else {{ alias }}._cdc_document end, null{% endif -%}
  {%- else -%}
    {%- set keys = {} -%}
    {%- for key in layout.key_columns %}{% do keys.update({key | lower: key}) %}{% endfor -%}
    {%- for field in fields -%}
      {%- if alias is not none and field in layout.image_columns -%}case when {{ deleted }} then null else named_struct('v', {{ alias }}.{{ cdclake.quote(field) }}) end
      {%- elif alias is not none and field | lower in keys -%}named_struct('v', {{ alias }}.{{ cdclake.quote(keys[field | lower]) }})
      {%- else -%}null{%- endif -%}
      {%- if not loop.last %}, {% endif -%}
    {%- endfor -%}
  {%- endif -%}
{%- endmacro %}


{#- The folded `after` of a unit row. Current state folds only each key's last change (the one that can win), unless
    `every` (history, soft deletes). An update without a document before it fails the run, unless, in current state
    (`current_state`), it is older than the key's prior state (a replay after a Debezium restart): it cannot apply,
    and its image is left null. (A history keeps a late update as a version: it must fold.)
    `placeholders`: documents fold unavailable-value placeholders, and one with no earlier value stays without one
    (as in typed images: last_value over nulls) instead of failing the run. `pre_image`: with no document before
    it, an update folds onto its segment's first pre-image (`before`), where the connector sends one. -#}
{% macro folded_image_sql(layout, fields, every, placeholders=false, current_state=true, pre_image=false, partial="_cdc_row.op = 'u'") -%}
  {%- if layout.document -%}
  {%- set base = cdclake.fold_base_sql(pre_image) -%}
  {%- set fold -%}
    {%- if every -%}
    _cdc_folded
    {%- else -%}
    {{ cdclake.fold_edits_sql('_cdc_edit_list', cdclake.fold_start_sql(pre_image, placeholders)) }}
    {%- endif -%}
  {%- endset -%}
  case when not ({{ partial }}) then _cdc_row.after
    when _cdc_full then _cdc_doc
    when {{ 'true' if every else '_cdc_pos = _cdc_last' }} then
      {%- if placeholders %}
      {{ fold }}
      {%- else %}
      case
        {%- if current_state %}
        when {{ base }} is null and _cdc_pos < _cdc_floor then null
        {%- endif %}
        when {{ base }} is null then {{ cdclake.json_error(cdclake.change_event_sql('_cdc_row.'), "'the key has no document before it (no insert, snapshot read or full update in bronze or silver)'") }}
        else {{ fold }} end
      {%- endif %}
  end
  {%- else -%}
  case when {{ partial }} then named_struct(
    {%- for field in fields %}'{{ field | replace("\\", "\\\\") | replace("'", "\\'") }}', _cdc_v{{ loop.index0 }}.v{% if not loop.last %}, {% endif %}{% endfor -%}
  ) else _cdc_row.after end
  {%- endif -%}
{%- endmacro %}


{#- The document a segment's updates fold onto: its first row's (a full image or prior state), else, with
    `pre_image`, its first update's pre-image; `placeholders`: an empty object when neither (see folded_image_sql). -#}
{% macro fold_start_sql(pre_image, placeholders) -%}
  {%- set base = cdclake.fold_base_sql(pre_image) -%}
  {{ "coalesce(trim(" ~ base ~ "), '{}')" if placeholders else 'trim(' ~ base ~ ')' }}
{%- endmacro %}


{#- The document before a segment's updates, null when there is none: its first row's, else (`pre_image`) its first
    update's pre-image. -#}
{% macro fold_base_sql(pre_image) -%}
  {{ 'coalesce(_cdc_base, _cdc_pre_image)' if pre_image else '_cdc_base' }}
{%- endmacro %}


{#- The document `start` with the JSON edits of the array expression `edits` applied in order. -#}
{% macro fold_edits_sql(edits, start) -%}
  aggregate({{ edits }}, {{ start }}, (_cdc_document, _cdc_edit) -> {{ cdclake.json_apply_edit('_cdc_document', '_cdc_edit') }})
{%- endmacro %}


{#- Names a bronze change event in messages: its key and where it is in Kafka. -#}
{% macro change_event_sql(prefix) -%}
  concat('key ', {{ prefix }}_cdc_key_json, ' (', {{ prefix }}_cdc_topic, ' partition ', {{ prefix }}_cdc_partition, ' offset ', {{ prefix }}_cdc_offset, ')')
{%- endmacro %}


{#- The full document of a MongoDB change: `after`, or an oplog-mode replacement (a patch without operators). -#}
{% macro document_image_sql(types) -%}
  {%- if 'patch' in types -%}
  coalesce(after, case when op = 'u' and not exists(json_object_keys(patch), _cdc_k -> left(_cdc_k, 1) = '$') then patch end)
  {%- else -%}
  after
  {%- endif -%}
{%- endmacro %}


{#-
  The edits (see json_documents.sql) of a MongoDB update without a full document; null for full images.
  updateDescription (change streams): truncatedArrays, then removedFields, then updatedFields. patch (oplog,
  MongoDB 3.x/4.x): $set and $unset; other operators and the $v 2 diff format fail when applied.
-#}
{% macro document_edits_sql(types, event) -%}
  {{ return(adapter.dispatch('document_edits_sql', 'cdclake')(types, event)) }}
{%- endmacro %}

{% macro default__document_edits_sql(types, event) -%}
  {%- set typed = types.get('updateDescription', '').startswith('struct') -%}
  {%- set updated = 'updateDescription.updatedFields' if typed else "get_json_object(updateDescription, '$.updatedFields')" -%}
  {%- set removed = 'updateDescription.removedFields' if typed else "from_json(get_json_object(updateDescription, '$.removedFields'), 'array<string>')" -%}
  {%- set truncated = 'updateDescription.truncatedArrays' if typed else "from_json(get_json_object(updateDescription, '$.truncatedArrays'), 'array<struct<field:string,size:int>>')" -%}
  case when op <> 'u' or after is not null then null
  {%- if 'updateDescription' in types %}
    when updateDescription is not null then concat(
      coalesce(transform({{ truncated }}, _cdc_t -> named_struct('op', 'truncate', 'path', split(_cdc_t.field, '[.]'),
        'value', cast(null as string), 'size', _cdc_t.size, 'event', {{ event }})), array()),
      {{ cdclake.json_unset_edits(removed, event) }},
      {{ cdclake.json_set_edits(updated, event) }})
  {%- endif %}
  {%- if 'patch' in types %}
    when patch is null then null
    when json_object_keys(patch) is null then {{ cdclake.json_fail_edits("'its oplog patch is not a JSON object'", event) }}
    when not exists(json_object_keys(patch), _cdc_k -> left(_cdc_k, 1) = '$') then null
    when exists(json_object_keys(patch), _cdc_k -> _cdc_k not in ('$set', '$unset', '$v'))
        or coalesce(get_json_object(patch, '$[\'$v\']'), '1') <> '1'
      then {{ cdclake.json_fail_edits("concat('oplog patches other than $set/$unset (format $v 1) are not supported: ', patch)", event) }}
    else concat(
      {{ cdclake.json_unset_edits("json_object_keys(get_json_object(patch, '$[\\'$unset\\']'))", event) }},
      {{ cdclake.json_set_edits("get_json_object(patch, '$[\\'$set\\']')", event) }})
  {%- endif %}
  end
{%- endmacro %}
