{#-
  What the materialization needs to know about a bronze table (written by `cdclake ingest`) and the model's SQL:
  the key columns and how to read them, the image columns, extracted columns, and the incremental input.
-#}

{% macro bronze_relation() -%}
  {%- if model.sources | length != 1 -%}
    {{ exceptions.raise_compiler_error("cdc_silver model '" ~ model.name ~ "' must select from exactly one bronze source() (found " ~ (model.sources | length) ~ ")") }}
  {%- endif -%}
  {{ return(source(model.sources[0][0], model.sources[0][1])) }}
{%- endmacro %}


{#- Column name -> Spark type text. DESCRIBE cuts a struct's type after spark.sql.debug.maxToStringFields fields
    (25 by default) with `... <n> more fields`: a change past them (a widened column of a wide row) would not show.
    The setting only shortens debug and plan strings: it is raised for the session when a type comes out cut, and
    the table described again (most tables are narrower: no statement for it). -#}
{% macro describe_columns(relation) -%}
  {%- set types = {} -%}
  {%- if not execute %}{{ return(types) }}{% endif -%}
  {%- set rows = run_query('describe table ' ~ relation).rows -%}
  {%- set cut = [] -%}
  {%- for row in rows if row[1] and modules.re.search('[.][.][.] [0-9]+ more fields>', row[1]) %}{% do cut.append(row[0]) %}{% endfor -%}
  {%- if cut -%}
    {% do run_query('set spark.sql.debug.maxToStringFields = 1000000') %}
    {%- set rows = run_query('describe table ' ~ relation).rows -%}
  {%- endif -%}
  {%- for row in rows -%}
    {%- if row[0] and not row[0].startswith('#') and row[0] not in types -%}{% do types.update({row[0]: row[1]}) %}{%- endif -%}
    {%- if row[0] and row[0].startswith('#') %}{% break %}{% endif -%}
  {%- endfor -%}
  {{ return(types) }}
{%- endmacro %}


{#- A dict that lasts as long as this node's run: dbt renders every macro a node calls in one context, whose `model`
    is one dict (empty outside a node, as in run-operation). It keeps what a run reads about bronze, which the run
    only reads: the same answer each time, for one statement instead of one per reader (the layout, partial images,
    transactions and the shipped tests each ask), and a consistent one should an ingest add a column meanwhile. -#}
{% macro run_memo() -%}
  {%- if model is not mapping %}{{ return({}) }}{% endif -%}
  {{ return(model.setdefault('cdclake_run_memo', {})) }}
{%- endmacro %}


{#- describe_columns of a bronze table, read once per run (run_memo). -#}
{% macro bronze_columns(bronze) -%}
  {%- set memo = cdclake.run_memo() -%}
  {%- set key = 'columns ' ~ bronze -%}
  {%- if key not in memo %}{% do memo.update({key: cdclake.describe_columns(bronze)}) %}{% endif -%}
  {{ return(memo[key]) }}
{%- endmacro %}


{#- The field names of struct column `column` of a bronze table, read once per run (run_memo). -#}
{% macro struct_field_names(relation, column) -%}
  {%- if not execute %}{{ return([]) }}{% endif -%}
  {%- set memo = cdclake.run_memo() -%}
  {%- set key = 'fields ' ~ relation ~ ' ' ~ column -%}
  {%- if key not in memo -%}
    {% do memo.update({key: run_query('select ' ~ column ~ '.* from ' ~ relation ~ ' where false').column_names | list}) %}
  {%- endif -%}
  {{ return(memo[key]) }}
{%- endmacro %}


{#- The columns of `input_sql` (the model's SQL over this run's changes of `bronze`), asked with the field names of
    bronze's struct columns (`key`, the images, `source`) in one statement that reads no data: a `describe query` of
    both, each struct's fields closed by a marker column. Rows rather than a result's columns, whose duplicate names
    dbt would rename: a field may share its name with another struct's or the input's. The fields are kept for
    struct_field_names (run_memo). -#}
{% macro input_columns(bronze, input_sql, types) -%}
  {%- set memo = cdclake.run_memo() -%}
  {%- set marker = '_cdc_end_of_fields' -%}
  {%- set structs = [] -%}
  {%- set probed = [] -%}
  {%- for column in ['key', 'before', 'after', 'source'] if types.get(column, '').startswith('struct') and ('fields ' ~ bronze ~ ' ' ~ column) not in memo -%}
    {%- do structs.append(column) -%}
    {%- do probed.append(column ~ '.*, true as ' ~ marker) -%}
  {%- endfor -%}
  {%- if structs -%}
    {%- set names = [] -%}
    {%- for row in run_query('describe query select * from (select ' ~ probed | join(', ') ~ ' from ' ~ bronze ~ ' where false) _cdc_fields cross join (' ~ input_sql ~ ') _cdc_input where false').rows -%}
      {%- do names.append(row[0]) -%}
    {%- endfor -%}
    {#- A field or a column of the model named as the marker: the input is asked on its own below, and each
        struct's fields when needed (struct_field_names). -#}
    {%- if names | select('equalto', marker) | list | length == structs | length -%}
      {#- The names between markers: each struct's fields, in order, then the model's columns. -#}
      {%- set parts = [[]] -%}
      {%- for name in names -%}
        {%- if name == marker %}{% do parts.append([]) %}{% else %}{% do parts[-1].append(name) %}{% endif -%}
      {%- endfor -%}
      {%- for column in structs %}{% do memo.update({'fields ' ~ bronze ~ ' ' ~ column: parts[loop.index0]}) %}{% endfor -%}
      {{ return(parts[-1]) }}
    {%- endif -%}
  {%- endif -%}
  {{ return(run_query('select * from (' ~ input_sql ~ ') where false').column_names | list) }}
{%- endmacro %}


{#- The field names seen in a sample of JSON text column `column` (a schemaless key or image); none when it holds
    no object yet. Names in JSON are case-sensitive, and get_json_object of a name the text does not have is null:
    a model's key named in another case than the source's would give every change the key NULL (one silver row).
    Sampled once per run (run_memo). -#}
{% macro json_field_names(relation, column) -%}
  {%- if not execute %}{{ return(none) }}{% endif -%}
  {%- set memo = cdclake.run_memo() -%}
  {%- set key = 'json fields ' ~ relation ~ ' ' ~ column -%}
  {%- if key not in memo -%}
    {%- set sample = 'select ' ~ column ~ ' as j from ' ~ relation ~ ' where ' ~ column ~ " like '{%' limit 100" -%}
    {%- set names = run_query('select distinct explode(json_object_keys(j)) from (' ~ sample ~ ') where json_object_keys(j) is not null').columns[0].values() | list -%}
    {% do memo.update({key: names if names else none}) %}
  {%- endif -%}
  {{ return(memo[key]) }}
{%- endmacro %}


{#- The field of JSON text with `names` (json_field_names) that key `key` reads: its own name, or the one name that
    differs from it in case only (as Spark resolves a struct's fields); none when the text has no such field. With
    no names known (nothing sampled yet), the key's own name. -#}
{% macro json_field_for(names, key) -%}
  {%- if names is none or key in names %}{{ return(key) }}{% endif -%}
  {%- set same = [] -%}
  {%- for name in names if name | lower == key | lower %}{% do same.append(name) %}{% endfor -%}
  {{ return(same[0] if same | length == 1 else none) }}
{%- endmacro %}


{#- Whether silver cannot have keys yet: the model names none, bronze (at snapshot `end`) has no key column, and
    every record it holds is a truncate. Debezium's truncates carry no key, so a table truncated before its first
    captured change (an empty table truncated, a connector started after its rows were deleted) gets bronze's key
    column with its first change. Until then a first run applies nothing (and records nothing: the run after it
    reads the truncate again with the changes), instead of failing as if the source table had no key. -#}
{% macro awaiting_keys(bronze, end) -%}
  {%- if not execute or config.get('keys') or cdclake.bronze_columns(bronze).get('key', '').startswith('struct') -%}
    {{ return(false) }}
  {%- endif -%}
  {{ return(run_query('select count(*) from ' ~ bronze ~ ' version as of ' ~ end ~ " where op <> 't'").rows[0][0] == 0) }}
{%- endmacro %}


{#- The model's key columns: config keys, else the fields of the Kafka key (`key_fields`). Fails with a clear message
    for a table without a key. -#}
{% macro model_keys(bronze, key_fields) -%}
  {%- set keys = config.get('keys') -%}
  {%- if keys is string %}{% set keys = [keys] %}{% endif -%}
  {%- if not keys -%}
    {%- set keys = key_fields -%}
  {%- endif -%}
  {%- if not keys -%}
    {{ exceptions.raise_compiler_error("cdc_silver model '" ~ model.name ~ "': bronze table " ~ bronze ~ " has no key (the source table has no primary key, or records carry no key schema); name the key columns with config(keys=[...])") }}
  {%- endif -%}
  {{ return(keys) }}
{%- endmacro %}


{#- Keys, image columns and expressions for one model. Fails with a clear message for a table without a key. -#}
{% macro silver_layout(bronze, input_sql) -%}
  {%- set types = cdclake.bronze_columns(bronze) -%}
  {%- set input_columns = cdclake.input_columns(bronze, input_sql, types) -%}
  {%- set key_type = types.get('key', '') -%}
  {%- set after_type = types.get('after', '') -%}
  {%- set typed_key = key_type.startswith('struct') -%}
  {%- set document = not after_type.startswith('struct') -%}
  {%- set key_fields = cdclake.struct_field_names(bronze, 'key') if typed_key else [] -%}
  {%- set keys = cdclake.model_keys(bronze, key_fields) -%}
  {%- set reading = cdclake.key_reading(bronze, keys, types, key_fields) -%}
  {%- set key_exprs = reading.exprs -%}
  {%- set image_columns = [] -%}
  {%- if document -%}
    {#- Documents (MongoDB, schemaless images) are kept whole in _cdc_document: the options would be ignored. -#}
    {%- for option in ['columns', 'exclude_columns'] if config.get(option) -%}
      {{ exceptions.raise_compiler_error("cdc_silver model '" ~ model.name ~ "': " ~ option ~ " picks columns of typed images, but bronze table " ~ bronze ~ " holds each image as one JSON document (MongoDB, or schemas.enable=false), kept whole in _cdc_document; select the fields to keep in the model's SQL instead (get_json_object(after, '$.email') as email)") }}
    {%- endfor -%}
  {%- else -%}
    {%- set fields = cdclake.struct_field_names(bronze, 'after') -%}
    {#- Names as Spark takes them: whatever their case. One that names no image column is a typo: said, not ignored. -#}
    {%- set chosen = {} -%}
    {%- for option in ['columns', 'exclude_columns'] -%}
      {%- set names = config.get(option) or [] -%}
      {%- if names is string %}{% set names = [names] %}{% endif -%}
      {%- set lowered = names | map('lower') | list -%}
      {%- set unknown = [] -%}
      {%- for name in names if name | lower not in fields | map('lower') | list %}{% do unknown.append(name) %}{% endfor -%}
      {%- if unknown -%}
        {{ exceptions.raise_compiler_error("cdc_silver model '" ~ model.name ~ "': " ~ option ~ " names " ~ unknown | join(', ') ~ ", which the images of bronze table " ~ bronze ~ " do not have (they have: " ~ fields | join(', ') ~ ")") }}
      {%- endif -%}
      {%- do chosen.update({option: lowered}) -%}
    {%- endfor -%}
    {%- for column in fields -%}
      {%- if column | lower not in keys | map('lower') | list and (not chosen.columns or column | lower in chosen.columns) and column | lower not in chosen.exclude_columns -%}
        {% do image_columns.append(column) %}
      {%- endif -%}
    {%- endfor -%}
  {%- endif -%}
  {#- Columns the model's SQL adds beyond bronze's (e.g. fields extracted from a MongoDB document). -#}
  {%- set extra_columns = [] -%}
  {%- for column in input_columns -%}
    {%- if column not in types and not column.startswith('_change_') and column != '_commit_snapshot_id' -%}{% do extra_columns.append(column) %}{%- endif -%}
  {%- endfor -%}
  {#- Silver takes each image column from `after`: a column of the model's own by that name would be a second one. -#}
  {%- set clashes = [] -%}
  {%- set taken = image_columns | map('lower') | list -%}
  {%- for column in extra_columns if column | lower in taken %}{% do clashes.append(column) %}{% endfor -%}
  {%- if clashes -%}
    {{ exceptions.raise_compiler_error("cdc_silver model '" ~ model.name ~ "': its SQL adds column(s) " ~ clashes | join(', ') ~ ", which silver already takes from the images of " ~ bronze ~ " (after." ~ clashes[0] ~ "): give them another name, or leave the image column out with exclude_columns") }}
  {%- endif -%}
  {%- set source_type = types.get('source', '') -%}
  {%- set source_ts_expr = 'timestamp_millis(source.ts_ms)' if source_type.startswith('struct') else "timestamp_millis(cast(get_json_object(source, '$.ts_ms') as bigint))" -%}
  {#- What the layout is made of: a run whose signature silver's properties hold needs no schema check. The last
      item names the metadata columns this version of cdclake keeps, so a table an earlier one checked is checked
      once more (evolve_silver_schema adds them). -#}
  {%- set signature = local_md5(tojson([types, input_sql, keys, config.get('columns'), config.get('exclude_columns'), 'values_position'])) -%}
  {{ return({
      'key_columns': keys, 'key_exprs': key_exprs, 'document': document, 'image_columns': image_columns,
      'image_expr': 'after', 'extra_columns': extra_columns, 'source_ts_expr': source_ts_expr,
      'signature': signature, 'input_columns': input_columns, 'key_moves': reading.moves}) }}
{%- endmacro %}


{#-
  The bronze snapshot the lakehouse is at now and whether snapshot `start` (if any) still exists:
  {'end': id or None (a table never written), 'start_known': bool, 'end_truncates', 'start_truncates': the running
  count of truncate records `cdclake ingest` keeps in each snapshot's summary (`cdclake.truncates-total`; None
  where a snapshot has none), 'end_records', 'start_records': bronze's row count at `end` and `start` (Iceberg's
  `total-records`), 'end_regressions', 'start_regressions': the running count of appends that held a change not
  newer than every change before them (`cdclake.order-regressions-total`; None where a snapshot has none),
  'end_order_max': the greatest `_cdc_order` of bronze's changes up to `end` (JSON, `cdclake.order-max`; None where
  the snapshot has none)}.
  Main's snapshot is Iceberg's `current-snapshot-id` table property (no Spark job); the summaries are read from the
  `snapshots` metadata table for those two snapshots only (0.1 s, against 0.2 s for a join of `refs` with every
  snapshot's summaries). With `start` still main's snapshot (nothing new: the model is up to date) that read is
  skipped, and the counts are None: nothing is applied.
-#}
{% macro bronze_snapshots(bronze, start) -%}
  {%- set unwritten = {'end': none, 'start_known': false, 'end_truncates': none, 'start_truncates': none, 'end_unavailable': none, 'start_unavailable': none, 'end_records': none, 'start_records': none, 'end_regressions': none, 'start_regressions': none, 'end_order_max': none} -%}
  {%- if not cdclake.table_exists(bronze.schema, bronze.identifier) -%}
    {{ log("cdclake: bronze table " ~ bronze ~ " does not exist yet (no change landed)", info=true) }}
    {{ return(unwritten) }}
  {%- endif -%}
  {%- set end = cdclake.table_properties(bronze).get('current-snapshot-id', 'none') -%}
  {%- if end == 'none' -%}{{ return(unwritten) }}{%- endif -%}
  {%- set start_id = none if start is none else (start | int | string) -%}
  {%- set found = dict(unwritten, end=end, start_known=start_id == end) -%}
  {%- if start_id == end -%}{{ return(found) }}{%- endif -%}
  {%- set rows = run_query("select snapshot_id, summary['cdclake.truncates-total'], summary['cdclake.unavailable-total'], summary['total-records'], summary['cdclake.order-regressions-total'], summary['cdclake.order-max'] from " ~ bronze ~ ".snapshots where snapshot_id in (" ~ ([end] + ([start_id] if start_id is not none else [])) | join(', ') ~ ")").rows -%}
  {%- for row in rows -%}
    {%- set side = 'end' if (row[0] | string) == end else 'start' -%}
    {%- if side == 'start' %}{% do found.update({'start_known': true}) %}{% endif -%}
    {%- do found.update({side ~ '_truncates': row[1], side ~ '_unavailable': row[2], side ~ '_records': row[3], side ~ '_regressions': row[4]}) -%}
    {%- if side == 'end' %}{% do found.update({'end_order_max': row[5]}) %}{% endif -%}
  {%- endfor -%}
  {{ return(found) }}
{%- endmacro %}


{#-
  Whether bronze's running count `count` (`truncates`, `unavailable`, `regressions`: the `start_<count>` and
  `end_<count>` of bronze_snapshots) is known to be the same at both ends of the unit of work after `start` (None:
  all of bronze, before which every count is 0): the unit then holds nothing that count counts, and a run need
  not read it to find out.
-#}
{% macro bronze_count_unchanged(snapshots, start, count) -%}
  {%- set before = '0' if start is none else snapshots['start_' ~ count] -%}
  {%- set after = snapshots['end_' ~ count] -%}
  {{ return(after is not none and before is not none and after == before) }}
{%- endmacro %}


{#- Whether the unit of work is known to hold no truncate. -#}
{% macro truncate_free(snapshots, start) -%}
  {{ return(cdclake.bronze_count_unchanged(snapshots, start, 'truncates')) }}
{%- endmacro %}


{#- Whether the unit of work is known to hold no update (or primary-key change's create) with Debezium's
    unavailable-value placeholder (an unchanged TOAST column; `cdclake.unavailable-total`). -#}
{% macro unavailable_free(snapshots, start) -%}
  {{ return(cdclake.bronze_count_unchanged(snapshots, start, 'unavailable')) }}
{%- endmacro %}


{#-
  Whether every change of the unit of work after `start` is known to be newer (by `_cdc_order`) than every change
  bronze held at `start`, so newer than anything a run applied from it: no append of the unit held a change not
  newer than all before it (`cdclake.order-regressions-total`, kept by `cdclake ingest`). A topic of one partition
  keeps the count; where partitions interleave, not known. Without `start` (all of bronze read again, silver
  possibly holding what it applied before), not known either.
-#}
{% macro unit_after_start(snapshots, start) -%}
  {{ return(start is not none and cdclake.bronze_count_unchanged(snapshots, start, 'regressions')) }}
{%- endmacro %}


{#- Every table property of a table, as a dict (one query: cdclake keeps what a table has applied there). -#}
{% macro table_properties(relation) -%}
  {%- set properties = {} -%}
  {%- for row in run_query('show tblproperties ' ~ relation).rows -%}
    {% do properties.update({row[0]: row[1]}) %}
  {%- endfor -%}
  {{ return(properties) }}
{%- endmacro %}


{#-
  The bronze rows added after snapshot `start` up to `end`, as a temporary view: Iceberg's incremental append scan
  (the DataFrame reader's start-/end-snapshot-id options, through CREATE TEMPORARY VIEW ... USING iceberg), so a
  run reads only the files the appends between them added, with column pruning and filter pushdown. Bronze is
  append-only (ingest appends; compaction's replace snapshots add no rows). Iceberg's changelog view would give
  the same rows but sorts them by every column first, to drop carry-over rows an append-only table never has.
  Without `start` (first run, --full-refresh, or the applied snapshot was expired), all of bronze as of `end`;
  the ordering guard makes re-reading already applied changes harmless.
  `checked`: the caller knows that `start` still exists (bronze_snapshots).
-#}
{% macro changes_view(bronze, start, end, checked=false) -%}
  {%- set view = cdclake.session_view('__cdc_changes') -%}
  {%- if start is not none and not checked -%}
    {%- if not cdclake.bronze_snapshots(bronze, start).start_known -%}
      {{ log("cdclake: bronze snapshot " ~ start ~ " applied by " ~ model.alias ~ " has been expired; re-reading all of " ~ bronze, info=true) }}
      {%- set start = none -%}
    {%- endif -%}
  {%- endif -%}
  {%- if start is none -%}
    {% do run_query('create or replace temporary view ' ~ view ~ ' as select * from ' ~ bronze ~ ' version as of ' ~ (end | int)) %}
  {%- else -%}
    {#- `path` names the table in the session's current catalog, the lakehouse's. -#}
    {% do run_query("create or replace temporary view " ~ view ~ " using iceberg options (path '" ~ bronze.schema ~ "." ~ bronze.identifier ~ "', 'start-snapshot-id' '" ~ (start | int) ~ "', 'end-snapshot-id' '" ~ (end | int) ~ "')") %}
  {%- endif -%}
  {{ return(view) }}
{%- endmacro %}


{#- Config exclude_changes: a condition on bronze's rows (`_cdc_partition = 0 and _cdc_offset = 12`) whose changes
    the model leaves out of all it applies, the fold of partial images included (a model's `where` applies after
    the fold): for an event no run can apply, such as a MongoDB update with no document before it in a history.
    Returns the relation to read the unit of work from. -#}
{% macro without_excluded_changes(changes) -%}
  {%- if not config.get('exclude_changes') %}{{ return(changes) }}{% endif -%}
  {%- set kept = cdclake.session_view('__cdc_kept') -%}
  {% do run_query('create or replace temporary view ' ~ kept ~ ' as select * from ' ~ changes ~ cdclake.kept_changes_filter()) %}
  {{ return(kept) }}
{%- endmacro %}


{#- " where <not excluded>" for a read of bronze's rows (empty without exclude_changes): every read of bronze
    beyond the unit of work (truncates before it, moved keys, the topics of a model) leaves out what the unit does. -#}
{% macro kept_changes_filter() -%}
  {%- set condition = config.get('exclude_changes') -%}
  {{- ' where not coalesce((' ~ condition ~ '), false)' if condition else '' -}}
{%- endmacro %}


{#-
  How each key column is read from a bronze row (`exprs`; every use of a key: net effect, tombstones, folding,
  history and the generic tests). From the Kafka key when it carries the field: a primary key, MongoDB's id.
  Otherwise from the change's image, `after`, or `before` for a delete: a source table without a primary key has a
  null Kafka key (typed bronze then has no `key` column), and the model names its keys. A delete whose `before` is
  null too (PostgreSQL without REPLICA IDENTITY FULL) has a null key. A typed key's fields are known now; a
  schemaless key (JSON text) is known only per row, so its field comes first and the images fill in where it has
  none.
  And `moves`: the condition under which an update moves its row to another key (none when every key comes from
  the Kafka key): for keys read from the images, an update whose `before` image holds a key (all its parts known)
  other than its `after` image's. Debezium sends a delete and a create when a primary key changes; for keys the
  model names (a table without a primary key, or other columns) only this update says that the old key's row is
  gone (with_key_changes). `old_exprs`: the key such an update moves its row from (its `before` image's).
-#}
{% macro key_reading(bronze, keys, types, key_fields=none) -%}
  {%- if key_fields is none -%}
    {%- set key_fields = cdclake.struct_field_names(bronze, 'key') if types.get('key', '').startswith('struct') else [] -%}
  {%- endif -%}
  {%- set key_fields = key_fields | map('lower') | list -%}
  {#- The images' fields (lowercase; none for JSON text), looked up only when a key is not in the Kafka key. -#}
  {%- set image_fields = {} -%}
  {%- for image in ['after', 'before'] if image in types and keys | map('lower') | reject('in', key_fields) | list -%}
    {% do image_fields.update({image: cdclake.struct_field_names(bronze, image) | map('lower') | list if types[image].startswith('struct') else none}) %}
  {%- endfor -%}
  {#- The fields of JSON text columns (schemaless), sampled once each when a key is looked up there. -#}
  {%- set json_names = {} -%}
  {%- for column in ['key'] + image_fields.keys() | list if column in types and not types[column].startswith('struct') -%}
    {%- if keys | map('lower') | reject('in', key_fields) | list %}{% do json_names.update({column: cdclake.json_field_names(bronze, column)}) %}{% endif -%}
  {%- endfor -%}
  {%- set exprs = {} -%}
  {%- set old_exprs = {} -%}
  {%- set moved = {'kafka': [], 'before': [], 'after': []} -%}
  {%- for key in keys -%}
    {%- if key | lower in key_fields -%}
      {% do exprs.update({key: 'key.' ~ cdclake.quote(key)}) %}
    {%- else -%}
      {%- set parts = [] -%}
      {%- if 'key' in types and not types['key'].startswith('struct') -%}
        {%- set name = cdclake.json_field_for(json_names.get('key'), key) -%}
        {%- if name is not none %}{% do parts.append(cdclake.json_key_expr(name)) %}{% endif -%}
      {%- endif -%}
      {%- if parts %}{% do moved.kafka.append(parts[0]) %}{% endif -%}
      {%- set images = {} -%}
      {%- for image, fields in image_fields.items() -%}
        {%- if fields is none -%}
          {%- set name = cdclake.json_field_for(json_names.get(image), key) -%}
          {%- if name is not none %}{% do images.update({image: cdclake.json_key_expr(name, image)}) %}{% endif -%}
        {%- elif key | lower in fields %}{% do images.update({image: image ~ '.' ~ cdclake.quote(key)}) %}{% endif -%}
      {%- endfor -%}
      {#- The image the change has: `after`, or `before` for a delete (never an update's old key). -#}
      {%- if images | length == 2 -%}
        {% do parts.append('case when after is null then ' ~ images['before'] ~ ' else ' ~ images['after'] ~ ' end') %}
        {% do moved.before.append(images['before']) %}
        {% do moved.after.append(images['after']) %}
        {% do old_exprs.update({key: images['before']}) %}
      {%- elif images -%}
        {% do parts.append(images.values() | first) %}
      {%- endif -%}
      {%- if not parts -%}
        {%- set seen = [] -%}
        {%- for column, names in json_names.items() if names %}{% do seen.append(column ~ ': ' ~ names | join(', ')) %}{% endfor -%}
        {{ exceptions.raise_compiler_error("cdc_silver model '" ~ model.name ~ "': key column '" ~ key ~ "' is neither a field of the Kafka key nor of the change images (after/before) in " ~ bronze ~ ('' if not seen else ' (their fields: ' ~ seen | join('; ') ~ ')')) }}
      {%- endif -%}
      {% do exprs.update({key: parts[0] if parts | length == 1 else 'coalesce(' ~ parts | join(', ') ~ ')'}) %}
    {%- endif -%}
    {%- if key not in old_exprs %}{% do old_exprs.update({key: exprs[key]}) %}{% endif -%}
  {%- endfor -%}
  {%- set moves = none -%}
  {%- if moved.before -%}
    {%- set conditions = ["op = 'u'", 'after is not null', 'before is not null'] -%}
    {#- A schemaless Kafka key that carries the field: Debezium's own delete and create say it. -#}
    {%- for part in moved.kafka %}{% do conditions.append(part ~ ' is null') %}{% endfor -%}
    {%- for part in moved.before %}{% do conditions.append(part ~ ' is not null') %}{% endfor -%}
    {%- set same = [] -%}
    {%- for part in moved.before %}{% do same.append(part ~ ' <=> ' ~ moved.after[loop.index0]) %}{% endfor -%}
    {% do conditions.append('not (' ~ same | join(' and ') ~ ')') %}
    {%- set moves = conditions | join(' and ') -%}
  {%- endif -%}
  {{ return({'exprs': exprs, 'moves': moves, 'old_exprs': old_exprs}) }}
{%- endmacro %}


{#-
  `relation_sql` (bronze rows: the model's input, or bronze itself) plus, for each update that moves its row to
  another key (`moves`, see key_reading), a delete of the old key at the update's position: the update's row with
  op 'd' and no `after`, so its key reads from `before`. Net effect, tombstones, history and the shipped tests then
  treat it as Debezium's delete of a changed primary key. `columns`: the relation's columns; `computed`: those the
  model computes (from `after`, say), null in the delete as in Debezium's, whose `after` is null.
-#}
{% macro with_key_changes(relation_sql, columns, moves, computed=[]) -%}
  {%- if moves is none %}{{ return(relation_sql) }}{% endif -%}
  {%- set listed = [] -%}
  {%- set deleted = [] -%}
  {%- for column in columns -%}
    {% do listed.append(cdclake.quote(column)) %}
    {%- if column == 'op' %}{% do deleted.append("'d' as op") %}
    {%- elif column == 'after' or column in computed %}{% do deleted.append('case when false then ' ~ cdclake.quote(column) ~ ' end as ' ~ cdclake.quote(column)) %}
    {%- else %}{% do deleted.append(cdclake.quote(column)) %}{% endif -%}
  {%- endfor -%}
  {{ return('select ' ~ listed | join(', ') ~ ' from (' ~ relation_sql ~ ') cdc_moved union all select ' ~ deleted | join(', ') ~ ' from (' ~ relation_sql ~ ') cdc_moved where ' ~ moves) }}
{%- endmacro %}


{#- A field of a schemaless (JSON text) column (the Debezium key, or an image), as a string. -#}
{% macro json_key_expr(name, column='key') -%}
  get_json_object({{ column }}, '$.{{ name | replace("\\", "\\\\") | replace("'", "\\'") }}')
{%- endmacro %}
