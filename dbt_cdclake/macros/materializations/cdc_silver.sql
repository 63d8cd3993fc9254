{#-
  materialized='cdc_silver': a current-state table of one bronze table, maintained by net-effect apply (or, with
  history='scd2', the table's version history: see scd2.sql).

  The model's SQL selects from one bronze source (usually `select * from {{ source('bronze', 't') }}`; a where
  clause or extracted columns are fine). Each run applies the bronze snapshots added since the last run as ONE
  step of silver's main branch (readers see the old state or the new one), guarded so that a change not newer
  than what silver holds for its key is ignored. Deleted keys keep a tombstone (key + position) so a late, older
  change cannot bring them back: in `<model>__cdc_tombstones` (delete_mode='hard', default) or as the row itself
  with _cdc_deleted = true (delete_mode='soft').

  Options: keys, delete_mode ('hard'|'soft'), columns / exclude_columns (image columns kept), exclude_changes (a
  condition on bronze rows whose changes are not applied, see without_excluded_changes), batch_catalog,
  ignore_null_updates (partial images: a null in an update keeps the key's previous value), unavailable_value
  (Debezium's unavailable.value.placeholder, default '__debezium_unavailable_value'; none: taken as a value),
  tombstone_horizon_days, broadcast_max_changes (the largest unit of work whose keys are broadcast, 2,000,000),
  history ('current', default | 'scd2': one row per version of each key, see scd2.sql), on_schema_change
  ('append_new_columns', default | 'ignore' | 'fail': columns the source added, see evolve_silver_schema).

  Partial images (ignore_null_updates; Debezium's placeholder for an unchanged TOAST or LOB column, config
  unavailable_value; MongoDB updates without a full document) are folded onto the key's previous image before net
  effect (partial_images.sql), so every path below sees full images.

  An incremental current-state run (docs/silver.md, "How a run applies a unit of work"):
  1. the new bronze rows are Iceberg's incremental append scan of the snapshots since the last run;
  2. they are decided into `<model>__cdc_batch_<invocation>`, an Iceberg table of this run in the scratch catalog
     (batch_schema; the next run to succeed drops it): per touched key the row silver must hold (for a hard
     delete, the key and its position). Silver and the tombstones are looked up only for the touched keys
     (broadcast semi-joins), and their positions only for changes at or below `cdclake.applied_position` (the greatest
     position ever applied): a change above it is newer than anything silver and the tombstones hold. Changes not
     newer than the latest truncate (this unit's or the one stored in `cdclake.truncated_before`) are void. One
     query over the batch counts what is to do;
  3. silver: DELETE the touched keys (and, with a new truncate, every row older than it), INSERT their new rows,
     both staged on a branch of this run, then main is fast-forwarded to it: one atomic step of main. (One MERGE
     would shuffle all of silver: Spark 3.5 plans a MERGE with an insert clause as a right outer join, which
     cannot broadcast the changes.) A unit of hard deletes only is staged the same way;
  4. tombstones: a matched-only MERGE for touched keys that have one, an INSERT for new ones; each skipped when
     there is nothing to do;
  5. `cdclake.bronze_snapshot_id` (and `cdclake.bronze_records`), `cdclake.applied_position` and
     `cdclake.truncated_before` are set in one commit: a run killed before re-applies the same unit, which is
     idempotent;
  6. the batch tables other runs left are dropped, only now: a run that fails drops none, so two overlapping runs
     cannot each drop the other's and both fail.
-#}
{% materialization cdc_silver, adapter='spark' %}
  {%- set identifier = model['alias'] -%}
  {%- set target = api.Relation.create(identifier=identifier, schema=schema, database=database, type='table') -%}
  {%- set tombstones = api.Relation.create(identifier=identifier ~ '__cdc_tombstones', schema=schema, database=database, type='table') -%}
  {%- set existing = adapter.get_relation(database=database, schema=schema, identifier=identifier) -%}
  {% do cdclake.check_options() %}
  {%- set delete_mode = config.get('delete_mode', 'hard') -%}
  {%- set history = config.get('history', 'current') -%}
  {%- set bronze = cdclake.bronze_relation() -%}
  {%- set horizon = config.get('tombstone_horizon_days') -%}
  {%- set removes_rows = false -%}

  {{ run_hooks(pre_hooks) }}

  {%- if bronze.limit is not none -%}
    {#- `--empty`: dbt renders each source as an empty subquery, to check a project without reading its data. The
        run checks the model against bronze's columns (its keys and column options included) and applies nothing:
        silver is neither created nor replaced. -#}
    {%- set plain = bronze.incorporate(limit=none) -%}
    {%- do cdclake.silver_layout(plain, sql | replace(bronze | string, plain | string)) -%}
    {{ log("cdclake: " ~ identifier ~ ": --empty: the model fits " ~ plain ~ "; nothing applied", info=true) }}
    {%- call statement('main') -%} select * from ({{ sql }}) where false {%- endcall -%}
    {{ run_hooks(post_hooks) }}
    {{ return({'relations': [target]}) }}
  {%- endif -%}

  {#- --full-refresh of an existing table: built as a first run is, but each table is replaced in one commit
      (`create or replace table ... as select`), so readers see the old table until the new one is there, and a
      rebuild that fails leaves the old one. -#}
  {%- set replacing = existing is not none and should_full_refresh() -%}
  {%- set properties = cdclake.table_properties(target) if existing is not none else {} -%}
  {#- A rebuild that changes history or delete_mode replaces tables of different columns one after the other: one
      killed (or failed) between them leaves them unlike each other, and the old table's properties describe
      neither. It marks silver first and unmarks it last (forget_replaced_state); the next run, of either model,
      finishes it. -#}
  {%- set pending = properties.get('cdclake.refresh_pending') -%}
  {%- if pending and not replacing -%}
    {{ log("cdclake: " ~ identifier ~ ": a --full-refresh of " ~ target ~ " (" ~ pending ~ ") did not finish; rebuilding it from bronze", info=true) }}
    {%- set replacing = true -%}
  {%- endif -%}
  {%- set rebuilt_as = 'history=' ~ history ~ ', delete_mode=' ~ delete_mode -%}
  {%- if replacing and pending != rebuilt_as and (pending or properties.get('cdclake.history', 'current') != history or properties.get('cdclake.delete_mode', delete_mode) != delete_mode) -%}
    {% do run_query("alter table " ~ target ~ " set tblproperties ('cdclake.refresh_pending' = '" ~ rebuilt_as ~ "')") %}
  {%- endif -%}
  {%- if replacing -%}
    {%- set existing = none -%}
    {%- set properties = {} -%}
  {%- endif -%}
  {%- if existing is none -%}
    {% do run_query('create namespace if not exists ' ~ schema) %}
  {%- endif -%}
  {%- if existing is not none %}{% do cdclake.apply_model_table_properties(target, properties) %}{% endif -%}
  {%- if existing is not none and properties.get('cdclake.history', 'current') != history -%}
    {{ exceptions.raise_compiler_error("cdc_silver model '" ~ model.name ~ "': " ~ target ~ " was built with history='" ~ properties.get('cdclake.history', 'current') ~ "', the model now says '" ~ history ~ "': rebuild it with --full-refresh") }}
  {%- endif -%}
  {#- A soft table has no tombstones table and a hard one no _cdc_deleted columns: each run would fail obscurely.
      (Recorded by every run since 2026-11-26; a table no run has recorded it on is not checked.) -#}
  {%- if existing is not none and properties.get('cdclake.delete_mode', delete_mode) != delete_mode -%}
    {{ exceptions.raise_compiler_error("cdc_silver model '" ~ model.name ~ "': " ~ target ~ " was built with delete_mode='" ~ properties.get('cdclake.delete_mode') ~ "', the model now says '" ~ delete_mode ~ "': rebuild it with --full-refresh") }}
  {%- endif -%}
  {#- Partitioning is set when silver is created (recorded since 2026-12-02, when partition_by began to apply). -#}
  {%- if existing is not none and properties.get('cdclake.partition_by') != cdclake.partitioning_text() -%}
    {{ exceptions.warn("cdc_silver model '" ~ model.name ~ "': " ~ target ~ " is partitioned by " ~ properties.get('cdclake.partition_by', 'nothing') ~ ", the model says " ~ (cdclake.partitioning_text() or 'nothing') ~ ": partition_by applies when silver is created; run it with --full-refresh to repartition") }}
  {%- endif -%}

  {%- set start = properties.get('cdclake.bronze_snapshot_id') -%}
  {%- set snapshots = cdclake.bronze_snapshots(bronze, start) -%}
  {%- set end = snapshots.end -%}
  {%- if end is not none and start is not none and start != end and not snapshots.start_known -%}
    {{ log("cdclake: bronze snapshot " ~ start ~ " applied by " ~ identifier ~ " has been expired; re-reading all of " ~ bronze, info=true) }}
    {%- set start = none -%}
  {%- endif -%}

  {%- if replacing and end is none -%}
    {#- Nothing in bronze to rebuild from (a table dropped for a recreated topic): no silver, as before a first run. -#}
    {% do run_query('drop table if exists ' ~ target) %}
    {% do run_query('drop table if exists ' ~ tombstones) %}
  {%- endif -%}
  {%- if end is none or (start is not none and start == end) -%}
    {{ log("cdclake: " ~ identifier ~ " is up to date with " ~ bronze, info=true) }}
    {%- call statement('main') -%} select 1 {%- endcall -%}
    {#- The horizon passes whether or not the table changes: a quiet table purges too. -#}
    {%- if horizon is not none and existing is not none and history != 'scd2' -%}
      {% do cdclake.purge_past_horizon(target, tombstones, delete_mode, horizon) %}
    {%- endif -%}
  {%- elif existing is none and cdclake.awaiting_keys(bronze, end) -%}
    {{ log("cdclake: " ~ identifier ~ ": " ~ bronze ~ " holds only truncates so far, which carry no key; nothing to apply until its first change", info=true) }}
    {%- call statement('main') -%} select 1 {%- endcall -%}
  {%- elif history == 'scd2' -%}
    {%- set run = cdclake.run_tables(target, properties) -%}
    {%- set changes = cdclake.without_excluded_changes(cdclake.changes_view(bronze, start, end, checked=true)) -%}
    {%- set layout = cdclake.silver_layout(bronze, sql | replace(bronze | string, changes)) -%}
    {%- do layout.update({'run_tables': run.batch}) -%}
    {%- set layout = cdclake.evolve_silver_schema(target, tombstones, layout, sql | replace(bronze | string, changes), delete_mode, properties) if existing is not none else layout -%}
    {%- set changes = cdclake.fold_partial_images(bronze, changes, layout, target if existing is not none else none, tombstones, delete_mode, history, probe_unavailable=not cdclake.unavailable_free(snapshots, start)) -%}
    {%- set input_sql = cdclake.with_key_changes(sql | replace(bronze | string, changes), layout.input_columns, layout.key_moves, layout.extra_columns) -%}
    {%- set truncates = cdclake.scd2_truncates(bronze, sql, input_sql, start, properties.get('cdclake.truncated_before'), probe=not cdclake.truncate_free(snapshots, start)) -%}
    {%- if truncates.unit %}{% do cdclake.refuse_truncate_across_topics(bronze, sql, input_sql, end, target) %}{% endif -%}
    {%- set main_sql = cdclake.scd2_prepare(input_sql, layout, target, tombstones, existing, delete_mode, truncates, replacing) -%}
    {#- The versions were decided from silver as this run read it: a run that committed since would be merged over. -#}
    {%- if existing is not none %}{% do cdclake.check_not_overtaken(target, properties) %}{% endif -%}
    {%- call statement('main') -%} {{ main_sql }} {%- endcall -%}
    {% do cdclake.scd2_finish(layout, tombstones, existing, delete_mode) %}
    {% do cdclake.drop_folded_images(layout, changes) %}
    {%- set recorded = ", 'cdclake.batch_schema' = '" ~ run.schema ~ "'" if run.schema != run.previous_schema else '' -%}
    {%- if truncates.stored and truncates.stored != properties.get('cdclake.truncated_before') %}{% set recorded = recorded ~ ", 'cdclake.truncated_before' = '" ~ truncates.stored ~ "'" %}{% endif -%}
    {% do run_query("alter table " ~ target ~ " set tblproperties (" ~ cdclake.applied_snapshot_properties(snapshots) ~ recorded ~ cdclake.signature_property(layout, properties) ~ ")") %}
    {%- if replacing %}{% do cdclake.forget_replaced_state(target, tombstones, history, delete_mode, ['cdclake.truncated_before'] if truncates.stored else []) %}{% endif -%}
    {#- And the tables of runs that failed, once this run's commits are done (see drop_batch_tables). -#}
    {% do cdclake.drop_batch_tables(target, run.schemas, none) %}
  {%- else -%}
    {%- set run = cdclake.run_tables(target, properties) -%}
    {%- set changes = cdclake.without_excluded_changes(cdclake.changes_view(bronze, start, end, checked=true)) -%}
    {#- The new changes are not cached: two statements read them (the truncate's position, unless bronze's counts
        rule a truncate out, and the batch), each only the columns it needs, which costs less than caching every
        bronze column (docs/silver.md). -#}
    {%- set incremental = start is not none -%}
    {#- An incremental unit's keys are broadcast to the joins with silver, unless the unit is large (a snapshot taken
        again, a long backlog): broadcasting millions of keys would exhaust the driver's memory on every retry. -#}
    {%- set unit_rows = none if snapshots.end_records is none or snapshots.start_records is none else (snapshots.end_records | int) - (snapshots.start_records | int) -%}
    {%- set broadcast = incremental and (unit_rows is none or unit_rows <= (config.get('broadcast_max_changes', 2000000) | int)) -%}
    {%- if incremental and not broadcast -%}
      {{ log("cdclake: " ~ identifier ~ ": a unit of " ~ unit_rows ~ " bronze rows (over broadcast_max_changes): joined with silver without broadcasting its keys", info=true) }}
    {%- endif -%}
    {%- set layout = cdclake.silver_layout(bronze, sql | replace(bronze | string, changes)) -%}
    {#- Before anything is written: silver gets the columns bronze's images gained (schema changes). -#}
    {%- do layout.update({'run_tables': run.batch}) -%}
    {%- set layout = cdclake.evolve_silver_schema(target, tombstones, layout, sql | replace(bronze | string, changes), delete_mode, properties) if existing is not none else layout -%}
    {%- set folded = cdclake.fold_partial_images(bronze, changes, layout, target if existing is not none else none, tombstones, delete_mode, history, probe_unavailable=not cdclake.unavailable_free(snapshots, start)) -%}
    {#- An update that moved its row to another key (keys read from the images) also deletes the old key. -#}
    {%- set input_sql = cdclake.with_key_changes(sql | replace(bronze | string, folded), layout.input_columns, layout.key_moves, layout.extra_columns) -%}
    {#- A soft-deleted row keeps its key's last values (net_effect_sql; without one in the unit: silver's). -#}
    {%- if delete_mode == 'soft' %}{% do layout.update({'keep_deleted_images': true}) %}{% endif -%}
    {#- A truncate (op t) removes every row older than it; changes older than it are void, in this unit of work
        and in every later one (a late change from before a truncate must not bring its row back). -#}
    {%- set truncate = cdclake.truncate_position(input_sql, properties.get('cdclake.truncated_before'), probe=not cdclake.truncate_free(snapshots, start)) -%}
    {%- if truncate is not none and truncate.new %}{% do cdclake.refuse_truncate_across_topics(bronze, sql, input_sql, end, target) %}{% endif -%}

    {%- if existing is none -%}
      {%- set winners = cdclake.session_view('__cdc_winners') -%}
      {#- The winners are all newer than the truncate: the changes it voids are left out before net effect. -#}
      {% do run_query('create or replace temporary view ' ~ winners ~ ' as ' ~ cdclake.net_effect_sql(cdclake.after_truncate_sql(input_sql, truncate), layout)) %}
      {#- Tombstones before silver: a run killed between the two commits finds no silver table and starts over;
          the other order left a silver table without tombstones, on which every later run failed. -#}
      {%- if delete_mode == 'hard' -%}
        {%- if not replacing %}{% do run_query('drop table if exists ' ~ tombstones) %}{% endif -%}
        {% do run_query(cdclake.create_tombstones_sql(tombstones, layout, winners, replacing)) %}
      {%- endif -%}
      {%- call statement('main') -%}
        create {% if replacing %}or replace {% endif %}table {{ target }}
        using iceberg
        {{ cdclake.silver_partitioning() }}
        tblproperties ({{ cdclake.silver_table_properties() }})
        as select {{ cdclake.silver_select(layout, 'w') }}
          {%- if delete_mode == 'soft' %}, w._cdc_op = 'd' as _cdc_deleted, case when w._cdc_op = 'd' then current_timestamp() end as _cdc_deleted_at,
          case when w._cdc_op = 'd' then coalesce(w._cdc_prior_position, {{ cdclake.no_values_position() }}) end as _cdc_values_position{% endif %}
        from {{ winners }} w
        {% if delete_mode == 'hard' %}where w._cdc_op <> 'd'{% endif %}
      {%- endcall -%}
      {#- Every position the new tables hold is at most this: later runs need not look up newer changes. -#}
      {%- set new_position = run_query(cdclake.held_position_sql(target, tombstones, delete_mode)).rows[0][0] -%}
    {%- else -%}
      {#- A branch left by a killed run (between its DELETE and the fast-forward) holds nothing main needs. -#}
      {% do cdclake.drop_apply_branches(target) %}
      {%- set applied_position = properties.get('cdclake.applied_position') -%}
      {%- if applied_position is none -%}
        {#- A table from before cdclake.applied_position: its bound, once, from what silver and tombstones hold. -#}
        {%- set applied_position = run_query(cdclake.held_position_sql(target, tombstones, delete_mode)).rows[0][0] -%}
      {%- endif -%}
      {#- The run's own batch table: a run of the model overlapping this one must not replace it between this run's
          DELETE and INSERT (with a longer bronze range, this run would insert rows of keys it did not delete).
          Those of earlier runs hold nothing this one needs. -#}
      {%- set batch = run.batch -%}
      {% do run_query(cdclake.batch_sql(batch, layout, input_sql, target, tombstones, delete_mode, applied_position, truncate, broadcast)) %}
      {%- set stats = run_query(cdclake.batch_stats_sql(batch, layout, delete_mode, applied_position)).rows[0] -%}
      {%- set new_position = stats[4] -%}
      {#- Without a null key in the batch, its keys match silver's with `=` (a faster join, the same rows). -#}
      {%- set null_safe = stats[5] > 0 -%}
      {%- set new_truncate = truncate is not none and truncate.new -%}
      {#- Every batch row removes its key's silver row (if any); those that are not hard deletes are inserted. -#}
      {%- set removes_rows = stats[0] > 0 or new_truncate -%}
      {%- set inserts_rows = stats[1] > 0 -%}
      {%- if removes_rows -%}
        {#- Staged on a branch of this run made from the snapshot the run's properties describe, then main is
            fast-forwarded to it: main moves once, from the old state to the new one. If anything moved main since
            the run read its properties (an overlapping run of the model), the fast-forward fails: this run's unit
            and applied position are stale, and applied on top of the other run's state they would overwrite newer
            rows. -#}
        {%- set branch = 'cdclake_apply_' ~ run.id -%}
        {%- set read_snapshot = properties.get('current-snapshot-id') -%}
        {% do run_query('alter table ' ~ target ~ ' create branch ' ~ branch ~ (' as of version ' ~ read_snapshot if read_snapshot not in (none, 'none') else '')) %}
        {%- set staged = target ~ '.branch_' ~ branch -%}
        {% do run_query(cdclake.silver_delete_sql(layout, batch, staged, truncate if new_truncate else none, broadcast, null_safe)) %}
        {%- if new_truncate and delete_mode == 'soft' -%}
          {% do run_query(cdclake.void_kept_values_sql(layout, staged, truncate)) %}
        {%- endif -%}
        {%- if inserts_rows -%}
          {% do run_query(cdclake.silver_insert_sql(layout, batch, staged, delete_mode)) %}
        {%- endif -%}
        {%- if horizon is not none and delete_mode == 'soft' -%}
          {#- On the branch too: main moves once per run. -#}
          {% do run_query(cdclake.soft_delete_purge_sql(staged, horizon)) %}
        {%- endif -%}
        {% do cdclake.check_not_overtaken(target, properties, branch) %}
        {%- call statement('main') -%}
          call system.fast_forward(table => '{{ target.schema }}.{{ target.identifier }}', branch => 'main', to => '{{ branch }}')
        {%- endcall -%}
        {% do run_query('alter table ' ~ target ~ ' drop branch if exists ' ~ branch) %}
      {%- else -%}
        {#- Nothing to change in silver; its properties still move on (below), which a stale run must not do. -#}
        {% do cdclake.check_not_overtaken(target, properties) %}
        {%- call statement('main') -%} select 1 {%- endcall -%}
      {%- endif -%}
      {%- if delete_mode == 'hard' and stats[2] > 0 -%}
        {% do run_query(cdclake.tombstone_merge_sql(layout, batch, tombstones, null_safe)) %}
      {%- endif -%}
      {%- if delete_mode == 'hard' and stats[3] > 0 -%}
        {% do run_query(cdclake.tombstone_insert_sql(layout, batch, tombstones)) %}
      {%- endif -%}
    {%- endif -%}
    {% do cdclake.drop_folded_images(layout, folded) %}
    {%- set updates = [cdclake.applied_snapshot_properties(snapshots) ~ cdclake.signature_property(layout, properties)] -%}
    {%- if new_position is not none %}{% do updates.append("'cdclake.applied_position' = '" ~ cdclake.position_json(new_position) ~ "'") %}{% endif -%}
    {%- if truncate %}{% do updates.append("'cdclake.truncated_before' = '" ~ truncate.stored ~ "'") %}{% endif -%}
    {%- if existing is not none and run.schema != run.previous_schema %}{% do updates.append("'cdclake.batch_schema' = '" ~ run.schema ~ "'") %}{% endif -%}
    {#- A table made before silver_table_properties had it (a property the user set stays). -#}
    {%- if existing is not none and 'write.delete.distribution-mode' not in properties %}{% do updates.append("'write.delete.distribution-mode' = 'none'") %}{% endif -%}
    {%- if existing is not none and 'write.metadata.metrics.column._cdc_applied_at' not in properties %}{% do updates.append(cdclake.applied_at_metrics()) %}{% endif -%}
    {% do run_query("alter table " ~ target ~ " set tblproperties (" ~ updates | join(', ') ~ ")") %}
    {%- if replacing -%}
      {%- set kept = (['cdclake.applied_position'] if new_position is not none else []) + (['cdclake.truncated_before'] if truncate else []) -%}
      {% do cdclake.forget_replaced_state(target, tombstones, history, delete_mode, kept) %}
    {%- endif -%}
    {%- if existing is not none -%}
      {% do cdclake.drop_batch_tables(target, run.schemas, run.name) %}
    {%- endif -%}
    {%- if horizon is not none and delete_mode == 'hard' -%}
      {% do cdclake.purge_past_horizon(target, tombstones, delete_mode, horizon) %}
    {%- elif horizon is not none and existing is not none and not removes_rows -%}
      {#- A run that staged a branch purged there, and a first build has nothing past the horizon; otherwise this
          is the run's only step of main. -#}
      {% do cdclake.purge_past_horizon(target, tombstones, delete_mode, horizon) %}
    {%- endif -%}
  {%- endif -%}

  {{ run_hooks(post_hooks) }}
  {% do persist_docs(target, model) %}
  {{ return({'relations': [target]}) }}
{% endmaterialization %}


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
  {%- for name in ['cdclake.applied_position', 'cdclake.truncated_before', 'cdclake.refresh_pending'] + (['cdclake.history'] if history == 'current' else []) + (['cdclake.partition_by'] if config.get('partition_by') is none else []) if name not in kept -%}
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


{#-
  Schema changes (docs/silver.md, "Schema changes"). When the source adds a column, `cdclake ingest` adds it to
  bronze's images, and the layout names it; silver (a history table too) does not have it yet. Per dbt's
  `on_schema_change` (cdc_silver's default: 'append_new_columns', as Debezium's JDBC sink does; 'sync_all_columns'
  is the same, since bronze never drops a column): silver gets the data columns it lacks (its rows hold NULL
  there) and its columns whose type bronze widened are widened (int -> bigint, float -> double, decimal
  precision); 'fail' stops the run naming them; 'ignore' leaves silver as it is and applies only the columns it
  has. Called before anything of the run is written, and compares with silver as it is: a retried run finds the
  columns a failed one added. Returns the layout to apply.
-#}
{% macro evolve_silver_schema(target, tombstones, layout, input_sql, delete_mode, properties) -%}
  {#- dbt gives every model on_schema_change='ignore' unless set: what the model (or project) says is what counts. -#}
  {%- set mode = config.get('on_schema_change') if 'on_schema_change' in cdclake.set_options() else 'append_new_columns' -%}
  {#- Nothing changed since a run that found silver matching the layout (the usual case): no query at all. -#}
  {%- if properties.get('cdclake.layout_signature') == layout.signature -%}{{ return(layout) }}{%- endif -%}
  {%- set held = {} -%}
  {%- for name in cdclake.describe_columns(target) %}{% do held.update({name | lower: name}) %}{% endfor -%}
  {#- cdclake's own columns that a table built by an earlier version lacks (its rows hold NULL there: unknown). -#}
  {%- if delete_mode == 'soft' and config.get('history', 'current') == 'current' and '_cdc_values_position' not in held -%}
    {% do run_query('alter table ' ~ target ~ ' add columns (_cdc_values_position ' ~ cdclake.values_position_type() ~ ')') %}
  {%- endif -%}
  {%- set columns = cdclake.data_columns(layout) -%}
  {%- set missing_keys = [] -%}
  {%- for key in layout.key_columns if key | lower not in held %}{% do missing_keys.append(key) %}{% endfor -%}
  {%- if missing_keys -%}
    {{ exceptions.raise_compiler_error("cdc_silver model '" ~ model.name ~ "': key column(s) " ~ missing_keys | join(', ') ~ " are not in " ~ target ~ " (its keys changed): rebuild it with --full-refresh") }}
  {%- endif -%}
  {#- The types of the layout's columns and of silver's: typeof() over a one-row outer join that reads nothing
      (Spark's DDL spelling of each type, never truncated as describe's may be). -#}
  {%- set shared = [] -%}
  {%- for column in columns if column | lower in held %}{% do shared.append(column) %}{% endfor -%}
  {%- set columns_sql -%}
    select {% for key in layout.key_columns %}{{ layout.key_exprs[key] }} as {{ cdclake.quote(key) }}, {% endfor -%}
      {%- for column in layout.image_columns %}{{ layout.image_expr }}.{{ cdclake.quote(column) }} as {{ cdclake.quote(column) }}, {% endfor -%}
      {%- if layout.document %}{{ layout.image_expr }} as _cdc_document, {% endif -%}
      {%- for column in layout.extra_columns %}{{ cdclake.quote(column) }}, {% endfor %}1 as _cdc_one
    from ({{ input_sql }}) bronze_input
  {%- endset -%}
  {%- set types_sql -%}
    select {% for column in columns %}typeof(i.{{ cdclake.quote(column) }}), {% endfor -%}
      {%- for column in shared %}typeof(t.{{ cdclake.quote(held[column | lower]) }}), {% endfor %}1
    from (select 1) o
    left join ({{ columns_sql }}) i on false
    left join {{ target }} t on false
  {%- endset -%}
  {%- set row = run_query(types_sql).rows[0] -%}
  {%- set added = [] -%}
  {%- set widened = [] -%}
  {%- set changed = [] -%}
  {%- for column in columns -%}
    {%- set new_type = row[loop.index0] -%}
    {%- if column | lower not in held -%}
      {% do added.append({'name': column, 'type': new_type}) %}
    {%- else -%}
      {%- set old_type = row[columns | length + shared.index(column)] -%}
      {%- if new_type != old_type and cdclake.widens(old_type, new_type) -%}
        {% do widened.append({'name': held[column | lower], 'type': new_type, 'was': old_type, 'key': column in layout.key_columns}) %}
      {%- elif new_type != old_type and not cdclake.widens(new_type, old_type) -%}
        {% do changed.append(column ~ ' (' ~ old_type ~ ' in silver, ' ~ new_type ~ ' in bronze)') %}
      {%- endif -%}
    {%- endif -%}
  {%- endfor -%}
  {%- if mode == 'ignore' -%}
    {#- Silver keeps its columns: only those are applied (types it has not widened are cast on insert). -#}
    {%- set narrowed = {} -%}
    {% do narrowed.update(layout) %}
    {% do narrowed.update({'image_columns': [], 'extra_columns': []}) %}
    {%- for column in layout.image_columns if column | lower in held %}{% do narrowed.image_columns.append(column) %}{% endfor -%}
    {%- for column in layout.extra_columns if column | lower in held %}{% do narrowed.extra_columns.append(column) %}{% endfor -%}
    {#- Left out columns are looked for again next run (the signature is kept only for a layout silver matches). -#}
    {%- if added or widened %}{% do narrowed.update({'signature': none}) %}{% endif -%}
    {{ return(narrowed) }}
  {%- endif -%}
  {%- if changed -%}
    {{ exceptions.raise_compiler_error("cdc_silver model '" ~ model.name ~ "': the type of column(s) " ~ changed | join(', ') ~ " changed in a way " ~ target ~ " cannot follow (cdc_silver widens int to bigint, float to double and decimal precision): rebuild it with --full-refresh") }}
  {%- endif -%}
  {%- if mode == 'fail' and (added or widened) -%}
    {%- set changes = [] -%}
    {%- if added %}{% do changes.append('new column(s) ' ~ added | map(attribute='name') | join(', ')) %}{% endif -%}
    {%- if widened %}{% do changes.append('widened column(s) ' ~ widened | map(attribute='name') | join(', ')) %}{% endif -%}
    {{ exceptions.raise_compiler_error("cdc_silver model '" ~ model.name ~ "': on_schema_change is 'fail' and the model's columns differ from " ~ target ~ ": " ~ changes | join('; ') ~ " (set on_schema_change='append_new_columns' to add them, or rebuild with --full-refresh)") }}
  {%- endif -%}
  {%- if added -%}
    {{ log("cdclake: adding column(s) " ~ added | map(attribute='name') | join(', ') ~ " to " ~ target ~ " (new in " ~ model.alias ~ "'s bronze images; existing rows hold NULL)", info=true) }}
    {#- A nested type in DDL (ddl_types); typeof()'s spelling of the others is DDL already. -#}
    {%- set nested = [] -%}
    {%- for column in added if '<' in column.type %}{% do nested.append(column) %}{% endfor -%}
    {%- if nested -%}
      {%- set ddl = cdclake.ddl_types(columns_sql, nested | map(attribute='name') | list, layout) -%}
      {%- for column in nested %}{% do column.update({'type': ddl[loop.index0]}) %}{% endfor -%}
    {%- endif -%}
    {% do run_query('alter table ' ~ target ~ ' add columns (' ~ cdclake.column_definitions(added) ~ ')') %}
  {%- endif -%}
  {%- for column in widened -%}
    {{ log("cdclake: widening column " ~ column.name ~ " of " ~ target ~ " from " ~ column.was ~ " to " ~ column.type, info=true) }}
    {% do run_query('alter table ' ~ target ~ ' alter column ' ~ cdclake.quote(column.name) ~ ' type ' ~ column.type) %}
    {#- A key column is in the tombstones too (an existing history table's hard deletes as well). -#}
    {%- if column.key and delete_mode == 'hard' -%}
      {% do run_query('alter table ' ~ tombstones ~ ' alter column ' ~ cdclake.quote(column.name) ~ ' type ' ~ column.type) %}
    {%- endif -%}
  {%- endfor -%}
  {{ return(layout) }}
{%- endmacro %}


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


{#- `name type, ...` for alter table ... add columns. -#}
{% macro column_definitions(columns) -%}
  {%- for column in columns %}{{ cdclake.quote(column.name) }} {{ column.type }}{% if not loop.last %}, {% endif %}{% endfor -%}
{%- endmacro %}


{#- The types of columns `names` of query `columns_sql`, in order, as Spark's DDL spells them. typeof() leaves the
    names of struct fields bare (struct<street name:string>), which `alter table ... add columns` cannot parse, and
    which cannot be told from the type around them when they hold one of `:,<>()`. Spark's DDL quotes them
    (STRUCT<`street name`: STRING>): read from SHOW CREATE TABLE of an empty table of the run. -#}
{% macro ddl_types(columns_sql, names, layout) -%}
  {%- set scratch = cdclake.scratch_table(layout, 'types') -%}
  {%- set columns = [] -%}
  {%- for name in names %}{% do columns.append(cdclake.quote(name) ~ ' as _cdc_t' ~ loop.index0) %}{% endfor -%}
  {% do run_query('create or replace table ' ~ scratch ~ ' using iceberg as select ' ~ columns | join(', ') ~ ' from (' ~ columns_sql ~ ') where false') %}
  {%- set ddl = run_query('show create table ' ~ scratch).rows[0][0] -%}
  {% do run_query('drop table if exists ' ~ scratch ~ ' purge') %}
  {#- A line per column, `  _cdc_t<i> <type>` and a comma, or for the last the `)` that closes the list. (No `NOT
      NULL`: the columns of an Iceberg table created from a query are optional, whatever its expressions are.) -#}
  {%- set types = [] -%}
  {%- for line in ddl.split('\n') if line.startswith('  _cdc_t') %}{% do types.append(line.split(' ', 3)[3][:-1]) %}{% endfor -%}
  {%- if types | length != names | length -%}
    {{ exceptions.raise_compiler_error("cdclake: could not read the types of " ~ names | join(', ') ~ " from: " ~ ddl) }}
  {%- endif -%}
  {{ return(types) }}
{%- endmacro %}


{#- Whether Iceberg can promote a column of type `old` to `new` (Spark's DDL spelling): int to bigint, float to
    double, a decimal's precision up at the same scale. Iceberg has no tinyint or smallint (it stores them as int),
    so a model's tinyint or smallint column fits silver's int or bigint. -#}
{% macro widens(old, new) -%}
  {%- set promotions = [('int', 'bigint'), ('float', 'double'), ('tinyint', 'smallint'), ('tinyint', 'int'),
                        ('tinyint', 'bigint'), ('smallint', 'int'), ('smallint', 'bigint')] -%}
  {%- if (old, new) in promotions %}{{ return(true) }}{% endif -%}
  {%- set decimal = modules.re.compile('^decimal\\((\\d+),(\\d+)\\)$') -%}
  {%- set a = decimal.match(old) -%}
  {%- set b = decimal.match(new) -%}
  {{ return(a is not none and b is not none and a.group(2) == b.group(2) and b.group(1) | int > a.group(1) | int) }}
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
  The latest truncate that applies to this run: the newest `op t` of the unit of work, or the one a previous run
  applied (stored in the silver table's properties as "<order,...>;<offset>"), whichever is newer. Returns none,
  or {literal: a position to compare with, stored: its property text, new: whether this unit of work moved it}.
  `probe`: false when the unit is known to hold no truncate (truncate_free): the unit is not read for one.
-#}
{% macro truncate_position(input_sql, previous, probe=true) -%}
  {%- set stored = previous or none -%}
  {%- if probe -%}
    {%- set candidates = ["(select max(named_struct('o', _cdc_order, 'r', 4, 'f', _cdc_offset)) from (" ~ input_sql ~ ") where op = 't')"] -%}
    {%- if previous -%}{% do candidates.append(cdclake.stored_position(previous)) %}{%- endif -%}
    {%- set row = run_query("select " ~ cdclake.stored_position_text('p') ~ " from (select " ~ ("greatest(" ~ candidates | join(', ') ~ ")" if candidates | length > 1 else candidates[0]) ~ " as p) where p is not null").rows -%}
    {%- set stored = row[0][0] if row else none -%}
  {%- endif -%}
  {%- if stored is none -%}{{ return(none) }}{%- endif -%}
  {{ return({'literal': cdclake.stored_position(stored), 'stored': stored, 'new': stored != previous}) }}
{%- endmacro %}


{#-
  A truncate ends every row of silver older than it, whichever topic the row came from. A model whose changes come
  from several topics (a bronze table several topics are mapped to by `ingest.table_mapping`: the partitions of a
  PostgreSQL partitioned table, whose TRUNCATE of one partition would empty them all, or several sources) stops
  instead, naming the topics and the ways out. Read only when the unit of work holds a truncate new to silver: the
  topics of the model's rows over all of bronze (of bronze's, should the model's SQL leave `_cdc_topic` out).
-#}
{% macro refuse_truncate_across_topics(bronze, sql, input_sql, end, target) -%}
  {%- set history = cdclake.session_view('__cdc_topics') -%}
  {% do run_query('create or replace temporary view ' ~ history ~ ' as select * from ' ~ bronze ~ ' version as of ' ~ (end | int) ~ cdclake.kept_changes_filter()) %}
  {%- set model_sql = sql | replace(bronze | string, history) -%}
  {%- if '_cdc_topic' not in run_query('select * from (' ~ model_sql ~ ') where false').column_names -%}
    {%- set model_sql, input_sql = 'select * from ' ~ history, 'select * from ' ~ history -%}
  {%- endif -%}
  {%- set row = run_query("select size(t), concat_ws(', ', t), (select concat_ws(', ', sort_array(collect_set(_cdc_topic))) from (" ~ input_sql ~ ") where op = 't') from (select sort_array(collect_set(_cdc_topic)) as t from (" ~ model_sql ~ "))").rows[0] -%}
  {%- if row[0] > 1 -%}
    {{ exceptions.raise_compiler_error("cdc_silver model '" ~ model.name ~ "': its changes come from " ~ row[0] ~ " topics (" ~ row[1] ~ "), and a truncate from " ~ row[2] ~ " would end every row of " ~ target ~ " older than it, the other topics' included (a TRUNCATE of one partition of a PostgreSQL partitioned table would empty every partition's rows). Give each topic a model of its own (where _cdc_topic = '...') and union them downstream, or leave truncates out of this model (exclude_changes=\"op = 't'\"), which keeps the rows they truncated.") }}
  {%- endif -%}
{%- endmacro %}


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


{#-
  Where a run's batch table lives (`<catalog>.<schema>`): the model's `batch_catalog` if it names one, else
  `cdclake_scratch`, an Iceberg Hadoop catalog under the lakehouse's warehouse (`<warehouse>/_cdclake_scratch`),
  set up in the session unless Spark already defines it. Dropping a table there deletes its directory (~30 ms); a
  purge in a JDBC or REST catalog runs a Spark job over the table's manifests (0.5-0.8 s, every run). A batch
  table is written and read by one run only, so the Hadoop catalog's lack of safe concurrent commits on object
  stores does not matter. Without a warehouse path, or when the lakehouse's catalog reads its files through its
  own `io-impl` (which a Hadoop catalog cannot use), batch tables stay in silver's namespace.
-#}
{% macro batch_schema(target) -%}
  {{ return(adapter.dispatch('batch_schema', 'cdclake')(target)) }}
{%- endmacro %}

{% macro default__batch_schema(target) -%}
  {%- set catalog = config.get('batch_catalog') -%}
  {%- if catalog -%}
    {#- A JDBC or REST catalog has no namespace until it is created (the Hadoop one makes its directory). -#}
    {% do run_query('create namespace if not exists ' ~ catalog ~ '.' ~ target.schema) %}
    {{ return(catalog ~ '.' ~ target.schema) }}
  {%- endif -%}
  {%- set catalog = 'cdclake_scratch' -%}
  {%- if cdclake.spark_setting('spark.sql.catalog.' ~ catalog) is none -%}
    {%- set lake = 'spark.sql.catalog.' ~ run_query('select current_catalog()').rows[0][0] -%}
    {%- set warehouse = cdclake.spark_setting(lake ~ '.warehouse') -%}
    {%- if warehouse is none or cdclake.spark_setting(lake ~ '.io-impl') is not none -%}
      {{ return(target.schema) }}
    {%- endif -%}
    {% do run_query('set `spark.sql.catalog.' ~ catalog ~ '`=`org.apache.iceberg.spark.SparkCatalog`') %}
    {% do run_query('set `spark.sql.catalog.' ~ catalog ~ '.type`=`hadoop`') %}
    {% do run_query('set `spark.sql.catalog.' ~ catalog ~ '.warehouse`=`' ~ warehouse.rstrip('/') ~ '/_cdclake_scratch`') %}
  {%- endif -%}
  {{ return(catalog ~ '.' ~ target.schema) }}
{%- endmacro %}


{#- This run's tables, decided once per run (batch_schema may run statements): `batch`, its batch table
    `<batch schema>.<model>__cdc_batch_<invocation>` (`name` without the schema), after which scratch_table names
    the others; `schemas`, where drop_batch_tables looks for earlier runs' tables: this run's schema and the one
    the previous run recorded in `cdclake.batch_schema` (`previous_schema`; before that property, silver's
    namespace) if it differs and its catalog is defined in this session. -#}
{% macro run_tables(target, properties) -%}
  {%- set id = invocation_id | replace('-', '') -%}
  {%- set batch_schema = cdclake.batch_schema(target) -%}
  {%- set name = target.identifier ~ '__cdc_batch_' ~ id -%}
  {%- set previous = properties.get('cdclake.batch_schema', target.schema) -%}
  {%- set schemas = [batch_schema] -%}
  {%- if previous != batch_schema -%}
    {%- if cdclake.catalog_defined(previous) -%}
      {% do schemas.append(previous) %}
    {%- else -%}
      {{ log("cdclake: the previous run of " ~ target.identifier ~ " left its batch table in " ~ previous ~ ", whose catalog this session does not define: it stays there", info=true) }}
    {%- endif -%}
  {%- endif -%}
  {{ return({'id': id, 'schema': batch_schema, 'name': name, 'batch': batch_schema ~ '.' ~ name, 'schemas': schemas, 'previous_schema': previous}) }}
{%- endmacro %}

{#- A table of this run next to its batch table (`<model>__cdc_batch_<invocation>_<kind>`; layout.run_tables is the
    batch table's name, see run_tables): intermediate results that later statements of the run read. Dropped by the
    run; drop_batch_tables drops those a failed run left. -#}
{% macro scratch_table(layout, kind) -%}
  {{ return(layout.run_tables ~ '_' ~ kind) }}
{%- endmacro %}


{#- Whether the catalog of `schema` (`[catalog.]namespace`) is defined in this session. -#}
{% macro catalog_defined(schema) -%}
  {%- set parts = schema.split('.') -%}
  {{ return(parts | length < 2 or parts[0] == 'spark_catalog' or cdclake.spark_setting('spark.sql.catalog.' ~ parts[0]) is not none) }}
{%- endmacro %}


{#-
  Drops the batch tables of earlier runs (`<model>__cdc_batch*`, all but this run's `keep`) in each of `schemas`
  (where this run's batch is and where the previous run's was, kept in `cdclake.batch_schema`; each run keeps its
  own until the next, for a look at what it applied). PURGE: Iceberg's DROP TABLE alone leaves the files in a JDBC
  or REST catalog. Called once this run's commits are done: a run overlapping this one may lose its table and fail
  (the next run applies what it did not), but a run that fails drops nothing, so two overlapping runs cannot drop
  each other's tables and both fail.
-#}
{% macro drop_batch_tables(target, schemas, keep) -%}
  {#- The names runs give them (older versions: without the invocation, or a shorter one), and nothing else (a
      cdc_silver model may not hold `__cdc_` in its name, check_options, but another table may). Catalogs that fold
      names to lower case list them so. -#}
  {%- set batch_name = modules.re.compile(modules.re.escape(target.identifier) ~ '__cdc_batch(_[0-9a-f]+(_folded|_folding|_history|_moves|_moves_folded|_moves_folding|_moves_done|_moves_earlier|_moved[0-9]*|_types)?)?', modules.re.IGNORECASE) -%}
  {%- for schema in schemas -%}
    {%- for row in run_query('show tables in ' ~ schema).rows if not row[2] and batch_name.fullmatch(row[1]) and row[1] != keep -%}
      {% do run_query('drop table if exists ' ~ schema ~ '.' ~ cdclake.quote(row[1]) ~ ' purge') %}
    {%- endfor -%}
  {%- endfor -%}
{%- endmacro %}


{#- Fails the run (dropping its branch) if another run of the model applied bronze since this one read `properties`,
    or anything else moved silver's main: its unit of work and applied position are stale. (The fast-forward would
    fail on a moved main too; this says why, and also catches a run that moved main before this one read the
    properties but recorded its bronze snapshot after.) -#}
{% macro check_not_overtaken(target, properties, branch=none) -%}
  {%- set now = cdclake.table_properties(target) -%}
  {%- set moved = now.get('current-snapshot-id') != properties.get('current-snapshot-id') -%}
  {%- if moved or now.get('cdclake.bronze_snapshot_id') != properties.get('cdclake.bronze_snapshot_id') -%}
    {%- if branch is not none %}{% do run_query('alter table ' ~ target ~ ' drop branch if exists ' ~ branch) %}{% endif -%}
    {{ exceptions.raise_compiler_error("cdc_silver model '" ~ model.name ~ "': " ~ target ~ " changed while this run applied bronze from snapshot " ~ properties.get('cdclake.bronze_snapshot_id') ~ " (now " ~ ('at silver snapshot ' ~ now.get('current-snapshot-id') if moved else 'applied up to bronze snapshot ' ~ now.get('cdclake.bronze_snapshot_id')) ~ "): another run of the model, or a write to silver, overtook it. Nothing was applied; run it again.") }}
  {%- endif -%}
{%- endmacro %}


{#- Drops the branches a killed run left (cdclake_apply_*): they would keep their snapshots from expiry. -#}
{% macro drop_apply_branches(target) -%}
  {%- for row in run_query('select name from ' ~ target ~ ".refs where type = 'BRANCH' and startswith(name, 'cdclake_apply_')").rows -%}
    {{ log("cdclake: dropping branch " ~ row[0] ~ " of " ~ target ~ ", left by a run that did not finish", info=true) }}
    {% do run_query('alter table ' ~ target ~ ' drop branch if exists ' ~ cdclake.quote(row[0])) %}
  {%- endfor -%}
{%- endmacro %}


{#-
  The unit of work, decided: per touched key the row silver must hold (for a delete in hard mode, the key and its
  position), left out when not newer than its key's silver row or tombstone, or not newer than the latest truncate.
  A delete at its own tombstone's position is kept: applying it again is idempotent, and two overlapping first
  builds can leave the tombstones of a longer bronze range than silver's, whose deletes silver still needs.
  Silver and tombstones are read only for the touched keys (left semi-joins, broadcast in an incremental run);
  the tombstones one row per key: two overlapping runs of the model that apply the same delete can both add its
  tombstone, and a joined duplicate would duplicate the key's batch row (a second silver row, a failed MERGE);
  their positions only for keys with changes at or below `applied_position` (none, usually: adaptive execution
  then skips the scan); silver's other columns only for soft deletes, which keep the values of the key's latest
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
  {%- set looked_up = ("i.op = 'd' or " ~ below) if delete_mode == 'soft' else below -%}
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
  as select {% if broadcast %}/*+ BROADCAST(t){% if delete_mode == 'hard' %}, BROADCAST(bx), BROADCAST(b){% endif %} */{% endif %}
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
  left join (
    select {{ hint }} {% for key in keys %}t.{{ cdclake.quote(key) }}, {% endfor %}t._cdc_order, t._cdc_op, t._cdc_offset,
      {%- if delete_mode == 'soft' %}{% for column in columns if column not in keys %} t.{{ cdclake.quote(column) }},{% endfor %} t._cdc_source_ts, t._cdc_deleted_at, t._cdc_values_position,{% endif %} true as _cdc_found
    from {{ target }} t
    left semi join (select {{ input_keys }} and ({{ looked_up }})) k on {{ cdclake.key_match(keys, 't', 'k') }}
  ) t on {{ cdclake.key_match(keys, 's', 't') }}
  {%- if delete_mode == 'hard' %}
  left join (
    select {{ hint }} {% for key in keys %}b.{{ cdclake.quote(key) }}, {% endfor %}max({{ cdclake.position('b') }}) as _cdc_position, true as _cdc_found
    from {{ tombstones }} b
    left semi join (select {{ input_keys }}) k on {{ cdclake.key_match(keys, 'b', 'k') }}
    group by {% for key in keys %}b.{{ cdclake.quote(key) }}{% if not loop.last %}, {% endif %}{% endfor %}
  ) bx on {{ cdclake.key_match(keys, 's', 'bx') }}
  left join (
    select {{ hint }} {% for key in keys %}b.{{ cdclake.quote(key) }}, {% endfor %}max({{ cdclake.position('b') }}) as _cdc_position, true as _cdc_found
    from {{ tombstones }} b
    left semi join (select {{ input_keys }} and ({{ below }})) k on {{ cdclake.key_match(keys, 'b', 'k') }}
    group by {% for key in keys %}b.{{ cdclake.quote(key) }}{% if not loop.last %}, {% endif %}{% endfor %}
  ) b on {{ cdclake.key_match(keys, 's', 'b') }}
  {%- endif %}
  where (t._cdc_found is null or {{ cdclake.position('s') }} > {{ cdclake.position('t') }}{% if delete_mode == 'soft' %} or {{ late_values }}{% endif %})
  {#- A delete of a key deleted at its position already, at another offset (a replay), is that delete: nothing to do
      (applied again, it would move the delete's _cdc_deleted_at, and with it the tombstone horizon), but for the
      newer values its unit may give a soft-deleted row. The same record read again is applied (see "a delete at its
      tombstone's position" in docs/silver.md). -#}
  {%- if delete_mode == 'soft' %}
    and not ({{ replayed_delete }} and not coalesce({{ late_values }}, false))
  {%- else %}
    and (b._cdc_found is null or {{ cdclake.position('s') }} > b._cdc_position or (s._cdc_op = 'd' and {{ cdclake.position('s') }} = b._cdc_position))
    and not (s._cdc_op = 'd' and s._cdc_order <=> bx._cdc_position.o and s._cdc_offset <> bx._cdc_position.f)
  {%- endif %}
{%- endmacro %}


{#- The changes of `input_sql` a truncate (`truncate_position`: this unit's or the latest applied one) leaves: an
    older one is void, as a key's winner and as the change whose values a soft-deleted row keeps. -#}
{% macro after_truncate_sql(input_sql, truncate) -%}
  {%- if truncate is none -%}
  {{ input_sql }}
  {%- else -%}
  select * from ({{ input_sql }}) i
  where {{ cdclake.change_position('i') }} > {{ truncate.literal }}
  {%- endif -%}
{%- endmacro %}


{#- With soft deletes, a new truncate also voids the values that rows soft-deleted after it kept from changes
    before it (a truncate landing late, or in the delete's unit): they keep none, as --full-refresh gives. Rows whose
    values are of an unknown change (null _cdc_values_position) keep them. -#}
{% macro void_kept_values_sql(layout, relation, truncate) -%}
  update {{ relation }} set
  {%- for column in cdclake.data_columns(layout) if column not in layout.key_columns %} {{ cdclake.quote(column) }} = null,{% endfor %}
    _cdc_values_position = {{ cdclake.no_values_position() }}
  where _cdc_op = 'd' and _cdc_values_position < {{ truncate.literal }} and _cdc_values_position > {{ cdclake.no_values_position() }}
{%- endmacro %}


{#- The position a soft-deleted row whose key had no values before its delete keeps (it holds nulls): below every
    change's, so that any later-landing change before the delete gives it values. -#}
{% macro no_values_position() -%}
  named_struct('o', cast(array() as array<bigint>), 'r', -1, 'f', cast(-1 as bigint))
{%- endmacro %}

{% macro values_position_type() -%}
  struct<o: array<bigint>, r: int, f: bigint>
{%- endmacro %}


{#-
  What the batch asks for: keys to remove from silver, rows to insert, tombstones to update or retire,
  tombstones to add; the new applied position (JSON): the greatest of the old one and the batch's; and its rows
  with a null key part (none, usually).
-#}
{% macro batch_stats_sql(batch, layout, delete_mode, applied_position) -%}
  {%- set greatest = 'max(' ~ cdclake.position('s') ~ ')' -%}
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
