{#- Silver's table properties: merge-on-read settings, the model's tblproperties and partitioning, and the properties that record what a run applied. -#}


{#-
  After a --full-refresh replaced silver and set its properties: Iceberg keeps a replaced table's properties, so
  those of the old table's runs that this one did not set (`kept`: those it did) go: where the old runs applied to,
  a truncate the rebuild did not find again, history='scd2' on a table that no longer is one, a partitioning the
  model no longer names. Last, so that a run
  killed before has the new bronze snapshot with old values, which cost a lookup or name the fix. So does a
  tombstones table the new delete_mode has none of.
-#}
{% macro forget_replaced_state(target, tombstones, history, delete_mode, kept) -%}
  {%- set stale = [] -%}
  {%- for name in ['cdclake.applied_position', 'cdclake.truncated_before', 'cdclake.held_transactions', 'cdclake.refresh_pending'] + (['cdclake.history'] if history == 'current' else []) + (['cdclake.partition_by'] if config.get('partition_by') is none else []) if name not in kept -%}
    {% do stale.append("'" ~ name ~ "'") %}
  {%- endfor -%}
  {%- if stale %}{% do run_query('alter table ' ~ target ~ ' unset tblproperties if exists (' ~ stale | join(', ') ~ ')') %}{% endif -%}
  {%- if delete_mode == 'soft' %}{% do run_query('drop table if exists ' ~ tombstones) %}{% endif -%}
{%- endmacro %}


{#-
  Merge-on-read: a run writes position deletes for the rows it replaces instead of rewriting their data files.
  `write.delete.distribution-mode` 'none': each task scanning silver writes the deletes of the files it read
  (Iceberg's default, 'hash', sends every delete of an unpartitioned table to one task: one core writes them all).
-#}
{#- `rows`: silver's own table (not its tombstones), whose rows carry _cdc_applied_at. -#}
{% macro silver_table_properties(rows=true) -%}
  {%- set properties = {
      'format-version': '2',
      'write.delete.mode': 'merge-on-read',
      'write.update.mode': 'merge-on-read',
      'write.merge.mode': 'merge-on-read',
      'write.delete.distribution-mode': 'none',
      'write.parquet.compression-codec': 'zstd'} -%}
  {%- if rows -%}
    {#- Iceberg keeps column bounds for the first 100 columns only: `cdclake status` reads silver's freshness from
        this one's, the last of a wide table. -#}
    {%- do properties.update({'write.metadata.metrics.column._cdc_applied_at': 'truncate(16)'}) -%}
    {#- The model's own (dbt-spark's `tblproperties` config), which may override these. -#}
    {%- do properties.update(cdclake.model_table_properties()) -%}
    {%- if cdclake.partitioning_text() %}{% do properties.update({'cdclake.partition_by': cdclake.partitioning_text()}) %}{% endif -%}
  {%- endif -%}
  {{ cdclake.properties_sql(properties) }}
{%- endmacro %}


{#- `'name' = 'value', ...` of a dict of properties, for a tblproperties clause. -#}
{% macro properties_sql(properties) -%}
  {%- set items = [] -%}
  {%- for name, value in properties.items() -%}
    {%- do items.append(cdclake.sql_string(name) ~ ' = ' ~ cdclake.sql_string(value)) -%}
  {%- endfor -%}
  {{ items | join(', ') }}
{%- endmacro %}


{#- The model's `tblproperties` (dbt-spark's config) as Iceberg reads them: text, booleans as true/false. -#}
{% macro model_table_properties() -%}
  {%- set properties = {} -%}
  {%- for name, value in (config.get('tblproperties') or {}).items() -%}
    {%- do properties.update({name | string: (value | string | lower) if value is boolean else value | string}) -%}
  {%- endfor -%}
  {{ return(properties) }}
{%- endmacro %}


{#- An existing silver table gets the model's `tblproperties` that it does not hold (a property taken out of the
    config stays: it may have been set by hand); `held`, silver's properties as the run read them, is updated with
    them (setting properties makes no snapshot, so the run's check that no other run overtook it is unchanged). -#}
{% macro apply_model_table_properties(target, held) -%}
  {%- set changed = {} -%}
  {%- for name, value in cdclake.model_table_properties().items() if held.get(name) != value %}{% do changed.update({name: value}) %}{% endfor -%}
  {%- if changed -%}
    {{ log("cdclake: setting " ~ changed.keys() | join(', ') ~ " of " ~ target ~ " (the model's tblproperties)", info=true) }}
    {% do run_query('alter table ' ~ target ~ ' set tblproperties (' ~ cdclake.properties_sql(changed) ~ ')') %}
    {% do held.update(changed) %}
  {%- endif -%}
{%- endmacro %}


{#- `partitioned by (...)` of the model's `partition_by` (dbt-spark's config: columns or Iceberg transforms such as
    `bucket(16, id)` or `days(updated_at)`), for the statement that creates silver. -#}
{% macro silver_partitioning() -%}
  {%- set partitions = cdclake.partition_fields() -%}
  {%- if partitions is not none -%}
    partitioned by ({{ partitions | join(', ') }})
  {%- endif -%}
{%- endmacro %}


{#- The model's `partition_by` as silver records it (`cdclake.partition_by`), none without one. -#}
{% macro partitioning_text() -%}
  {%- set partitions = cdclake.partition_fields() -%}
  {{ return(none if partitions is none else tojson(partitions)) }}
{%- endmacro %}


{#- The model's `partition_by` as a list (dbt-spark takes one name or a list), none without one. -#}
{% macro partition_fields() -%}
  {%- set partitions = config.get('partition_by') -%}
  {{ return(none if partitions is none else ([partitions] if partitions is string else partitions)) }}
{%- endmacro %}


{% macro applied_at_metrics() -%}
  'write.metadata.metrics.column._cdc_applied_at' = 'truncate(16)'
{%- endmacro %}


{#- `'cdclake.bronze_snapshot_id' = '<id>'`: the bronze snapshot `snapshots` (bronze_snapshots) ends at, which this
    run applied; with `, 'cdclake.bronze_records' = '<n>'`, bronze's row count there. Bronze is append-only and its
    compaction keeps the count: `cdclake status` tells whether silver is behind from it once the snapshot itself has
    been expired and only rewrites follow it. -#}
{% macro applied_snapshot_properties(snapshots) -%}
  'cdclake.bronze_snapshot_id' = '{{ snapshots.end }}'
  {%- if snapshots.end_records is not none %}, 'cdclake.bronze_records' = '{{ snapshots.end_records | int }}'{% endif -%}
{%- endmacro %}


{#- `, 'cdclake.layout_signature' = '<md5>'` when silver now matches a layout whose signature it does not hold yet;
    `, 'cdclake.images' = '<json>'` when it says otherwise than silver does how the run read bronze's images: the
    image columns it applied, and what an update may leave out (ignore_null_updates' nulls, the unavailable-value
    placeholder), which cdclake_equals_recompute compares and does not compare. -#}
{% macro signature_property(layout, properties) -%}
  {%- if layout.signature and properties.get('cdclake.layout_signature') != layout.signature -%}
    , 'cdclake.layout_signature' = '{{ layout.signature }}'
  {%- endif -%}
  {%- set delete_mode = config.get('delete_mode', 'hard') -%}
  {%- if properties.get('cdclake.delete_mode') != delete_mode -%}
    , 'cdclake.delete_mode' = '{{ delete_mode }}'
  {%- endif -%}
  {%- set images = tojson({'image_columns': layout.image_columns, 'ignore_null_updates': not not config.get('ignore_null_updates', false), 'unavailable_value': cdclake.configured_placeholder()}) -%}
  {%- if properties.get('cdclake.images') != images -%}
    , 'cdclake.images' = {{ cdclake.sql_string(images) }}
  {%- endif -%}
{%- endmacro %}
