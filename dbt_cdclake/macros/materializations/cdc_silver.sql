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
  ('append_new_columns', default | 'ignore' | 'fail': columns the source added, see evolve_silver_schema),
  complete_transactions / transaction_timeout_minutes (a source transaction's changes wait until all have landed,
  see transactions.sql).

  Partial images (ignore_null_updates; Debezium's placeholder for an unchanged TOAST or LOB column, config
  unavailable_value; MongoDB updates without a full document) are folded onto the key's previous image before net
  effect (partial_images.sql), so every path below sees full images.

  An incremental current-state run (docs/silver.md, "How a run applies a unit of work"):
  1. the new bronze rows are Iceberg's incremental append scan of the snapshots since the last run;
  2. they are decided into `<model>__cdc_batch_<run id>`, an Iceberg table of this run in the scratch catalog
     (batch_schema; the next run to succeed drops it): per touched key the row silver must hold (for a hard
     delete, the key and its position). Silver and the tombstones are looked up only for the touched keys
     (broadcast semi-joins), silver's positions only for changes at or below `cdclake.applied_position` (no
     applied change is above it): a change above it is newer than anything silver holds (and when bronze's
     snapshots show every change of the unit newer than all before it, unit_after_start, silver is not read).
     Changes not newer than the latest truncate (this unit's or the one stored in `cdclake.truncated_before`) are
     void. One query over the batch counts what is to do;
  3. silver: DELETE the touched keys (and, with a new truncate, every row older than it), INSERT their new rows,
     both staged on a branch of this run, then main is fast-forwarded to it: one atomic step of main. (One MERGE
     would shuffle all of silver: Spark 3.5 plans a MERGE with an insert clause as a right outer join, which
     cannot broadcast the changes.) A unit of hard deletes only is staged the same way;
  4. tombstones: a matched-only MERGE for touched keys that have one, an INSERT for new ones; each skipped when
     there is nothing to do;
  5. `cdclake.bronze_snapshot_id` (and `cdclake.bronze_records`), `cdclake.applied_position`,
     `cdclake.truncated_before` and `cdclake.run_id` are set in one commit: a run killed before re-applies the same
     unit, which is idempotent;
  6. the batch tables other runs left are dropped, only now, with the branches of runs that did not finish: a run
     that fails drops none, so two overlapping runs cannot each drop the other's and both fail.

  Its macros, by concern: apply.sql (the batch and the statements of steps 2-4), positions.sql, truncates.sql,
  run_tables.sql (this run's tables and branch, the guards between runs), silver_properties.sql (step 5 and the
  model's table properties), schema_evolution.sql, net_effect.sql, partial_images.sql, scd2.sql, bronze.sql.
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

  {#- Changes held for transactions not complete then (complete_transactions, transactions.sql): bronze is read
      again from where their unit began, even with nothing new in bronze (their END lands in another table). -#}
  {%- set held = cdclake.held_transactions(properties) -%}
  {%- set start = held.get('from') if held is not none else properties.get('cdclake.bronze_snapshot_id') -%}
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
  {%- set up_to_date = end is none or (start is not none and start == end) -%}
  {%- set broadcast = false -%}
  {%- if not up_to_date -%}
    {#- An incremental unit's keys are broadcast to the joins with silver, unless the unit is large (a snapshot taken
        again, a long backlog): broadcasting millions of keys would exhaust the driver's memory on every retry. -#}
    {%- set unit_rows = none if snapshots.end_records is none or snapshots.start_records is none else (snapshots.end_records | int) - (snapshots.start_records | int) -%}
    {%- set broadcast = start is not none and (unit_rows is none or unit_rows <= (config.get('broadcast_max_changes', 2000000) | int)) -%}
    {%- if start is not none and not broadcast -%}
      {{ log("cdclake: " ~ identifier ~ ": a unit of " ~ unit_rows ~ " bronze rows (over broadcast_max_changes): joined with silver without broadcasting its keys", info=true) }}
    {%- endif -%}
  {%- endif -%}
  {%- if up_to_date -%}
    {{ log("cdclake: " ~ identifier ~ " is up to date with " ~ bronze, info=true) }}
    {%- call statement('main') -%} select 1 {%- endcall -%}
    {#- The horizon passes whether or not the table changes: a quiet table purges too. -#}
    {%- if horizon is not none and existing is not none and history != 'scd2' and held is none -%}
      {% do cdclake.purge_past_horizon(target, tombstones, delete_mode, horizon) %}
    {%- endif -%}
  {%- elif existing is none and cdclake.awaiting_keys(bronze, end) -%}
    {{ log("cdclake: " ~ identifier ~ ": " ~ bronze ~ " holds only truncates so far, which carry no key; nothing to apply until its first change", info=true) }}
    {%- call statement('main') -%} select 1 {%- endcall -%}
  {%- elif history == 'scd2' -%}
    {%- set run = cdclake.run_tables(target, properties) -%}
    {%- set completed = cdclake.without_incomplete_transactions(bronze, cdclake.without_excluded_changes(cdclake.changes_view(bronze, start, end, checked=true)), start, end, properties, cdclake.scratch_table({'run_tables': run.batch}, 'held')) -%}
    {%- set changes = completed.changes -%}
    {%- set layout = cdclake.silver_layout(bronze, sql | replace(bronze | string, changes)) -%}
    {%- do layout.update({'run_tables': run.batch}) -%}
    {%- set layout = cdclake.evolve_silver_schema(target, tombstones, layout, sql | replace(bronze | string, changes), delete_mode, properties) if existing is not none else layout -%}
    {%- set changes = cdclake.fold_partial_images(bronze, changes, layout, target if existing is not none else none, tombstones, delete_mode, history, probe_unavailable=not cdclake.unavailable_free(snapshots, start)) -%}
    {%- set input_sql = cdclake.with_key_changes(sql | replace(bronze | string, changes), layout.input_columns, layout.key_moves, layout.extra_columns) -%}
    {%- set truncates = cdclake.scd2_truncates(bronze, sql, input_sql, start, properties.get('cdclake.truncated_before'), probe=not cdclake.truncate_free(snapshots, start)) -%}
    {%- if truncates.unit %}{% do cdclake.refuse_truncate_across_topics(bronze, sql, input_sql, end, target) %}{% endif -%}
    {#- A truncate in the unit touches every key with a version open at it: not broadcast. -#}
    {%- set broadcast = broadcast and not truncates.unit -%}
    {%- set main_sql = cdclake.scd2_prepare(input_sql, layout, target, tombstones, existing, delete_mode, truncates, replacing, broadcast) -%}
    {%- set branch = none -%}
    {%- if existing is not none -%}
      {#- Staged on a branch of this run, then main is fast-forwarded to it, as in the current-state path below. -#}
      {%- set branch = cdclake.scd2_stage(target, layout, delete_mode, properties, run.id, broadcast) -%}
      {%- set main_sql = cdclake.fast_forward_sql(target, branch) if branch is not none else 'select 1' -%}
      {#- The versions were decided from silver as this run read it: a run that committed since would be overwritten. -#}
      {% do cdclake.check_not_overtaken(target, properties, run, branch) %}
    {%- endif -%}
    {%- call statement('main') -%} {{ main_sql }} {%- endcall -%}
    {%- if branch is not none %}{% do cdclake.drop_apply_branch(target, branch) %}{% endif -%}
    {% do cdclake.scd2_finish(layout, tombstones, existing, delete_mode) %}
    {% do cdclake.drop_folded_images(layout, changes) %}
    {%- set recorded = ", 'cdclake.batch_schema' = '" ~ run.schema ~ "'" if run.schema != run.previous_schema else '' -%}
    {%- if truncates.stored and truncates.stored != properties.get('cdclake.truncated_before') %}{% set recorded = recorded ~ ", 'cdclake.truncated_before' = '" ~ truncates.stored ~ "'" %}{% endif -%}
    {#- A table made before silver_table_properties had it (a property the user set stays). -#}
    {%- if existing is not none and 'write.delete.distribution-mode' not in properties %}{% set recorded = recorded ~ ", 'write.delete.distribution-mode' = 'none'" %}{% endif -%}
    {% do run_query("alter table " ~ target ~ " set tblproperties (" ~ cdclake.applied_snapshot_properties(snapshots) ~ recorded ~ cdclake.signature_property(layout, properties) ~ cdclake.held_transactions_property(completed) ~ cdclake.run_id_property(run) ~ ")") %}
    {%- if replacing %}{% do cdclake.forget_replaced_state(target, tombstones, history, delete_mode, (['cdclake.truncated_before'] if truncates.stored else []) + (['cdclake.held_transactions'] if completed.held else [])) %}{% endif -%}
    {#- And the tables of runs that failed, once this run's commits are done (see drop_batch_tables). -#}
    {% do cdclake.drop_batch_tables(target, run, none) %}
  {%- else -%}
    {%- set run = cdclake.run_tables(target, properties) -%}
    {%- set completed = cdclake.without_incomplete_transactions(bronze, cdclake.without_excluded_changes(cdclake.changes_view(bronze, start, end, checked=true)), start, end, properties, cdclake.scratch_table({'run_tables': run.batch}, 'held')) -%}
    {%- set changes = completed.changes -%}
    {#- While transactions are held, the next run reads again changes this one applied: the tombstones (and
        soft-deleted rows) that make them change nothing stay until then, past the horizon or not. -#}
    {%- if completed.held %}{% set horizon = none %}{% endif -%}
    {#- The new changes are not cached: two statements read them (the truncate's position, unless bronze's counts
        rule a truncate out, and the batch), each only the columns it needs, which costs less than caching every
        bronze column (docs/silver.md). -#}
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
      {%- set applied_position = properties.get('cdclake.applied_position') -%}
      {%- if applied_position is none -%}
        {#- A table from before cdclake.applied_position: its bound, once, from what silver and tombstones hold. -#}
        {%- set applied_position = run_query(cdclake.held_position_sql(target, tombstones, delete_mode)).rows[0][0] -%}
      {%- endif -%}
      {#- The run's own batch table: a run of the model overlapping this one must not replace it between this run's
          DELETE and INSERT (with a longer bronze range, this run would insert rows of keys it did not delete).
          Those of earlier runs hold nothing this one needs. -#}
      {%- set batch = run.batch -%}
      {#- A unit whose every change is newer than anything silver applied (bronze's order counts) needs no lookup of
          silver's positions: not when held transactions moved its start back, nor when folding partial images gave
          a change the position of an earlier one (a primary-key change's delete). -#}
      {%- do layout.update({'unit_after_applied': held is none and folded == changes and cdclake.unit_after_start(snapshots, start)}) -%}
      {% do run_query(cdclake.batch_sql(batch, layout, input_sql, target, tombstones, delete_mode, applied_position, truncate, broadcast)) %}
      {#- The applied position moves up to bronze's greatest order so far when bronze's snapshots know it (an upper
          bound of the unit's positions, which is all the lookups above need of it), else to the batch's greatest. -#}
      {%- set bound = cdclake.order_bound_position(snapshots.end_order_max) -%}
      {%- set stats = run_query(cdclake.batch_stats_sql(batch, layout, delete_mode, applied_position, bound)).rows[0] -%}
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
        {%- set branch = cdclake.create_apply_branch(target, properties, run.id) -%}
        {%- set staged = branch.relation -%}
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
        {% do cdclake.check_not_overtaken(target, properties, run, branch.name) %}
        {%- call statement('main') -%} {{ cdclake.fast_forward_sql(target, branch.name) }} {%- endcall -%}
        {% do cdclake.drop_apply_branch(target, branch.name) %}
      {%- else -%}
        {#- Nothing to change in silver; its properties still move on (below), which a stale run must not do. -#}
        {% do cdclake.check_not_overtaken(target, properties, run) %}
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
    {%- set updates = [cdclake.applied_snapshot_properties(snapshots) ~ cdclake.signature_property(layout, properties) ~ cdclake.held_transactions_property(completed) ~ cdclake.run_id_property(run)] -%}
    {%- if new_position is not none %}{% do updates.append("'cdclake.applied_position' = '" ~ cdclake.position_json(new_position) ~ "'") %}{% endif -%}
    {%- if truncate %}{% do updates.append("'cdclake.truncated_before' = '" ~ truncate.stored ~ "'") %}{% endif -%}
    {%- if existing is not none and run.schema != run.previous_schema %}{% do updates.append("'cdclake.batch_schema' = '" ~ run.schema ~ "'") %}{% endif -%}
    {#- A table made before silver_table_properties had it (a property the user set stays). -#}
    {%- if existing is not none and 'write.delete.distribution-mode' not in properties %}{% do updates.append("'write.delete.distribution-mode' = 'none'") %}{% endif -%}
    {%- if existing is not none and 'write.metadata.metrics.column._cdc_applied_at' not in properties %}{% do updates.append(cdclake.applied_at_metrics()) %}{% endif -%}
    {% do run_query("alter table " ~ target ~ " set tblproperties (" ~ updates | join(', ') ~ ")") %}
    {%- if replacing -%}
      {%- set kept = (['cdclake.applied_position'] if new_position is not none else []) + (['cdclake.truncated_before'] if truncate else []) + (['cdclake.held_transactions'] if completed.held else []) -%}
      {% do cdclake.forget_replaced_state(target, tombstones, history, delete_mode, kept) %}
    {%- endif -%}
    {%- if existing is not none -%}
      {% do cdclake.drop_batch_tables(target, run, run.name) %}
    {%- elif completed.get('table') -%}
      {% do run_query('drop table if exists ' ~ completed.table ~ ' purge') %}
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
