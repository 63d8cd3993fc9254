{#- The tables and branches of one run, and the guards between overlapping runs. -#}


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
    {%- set lake = 'spark.sql.catalog.' ~ cdclake.current_catalog() -%}
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


{#- This run's tables, decided once per run (batch_schema may run statements): `id`, the run's id (run_id); `batch`,
    its batch table `<batch schema>.<model>__cdc_batch_<id>` (`name` without the schema), after which scratch_table
    names the others; `schemas`, where drop_batch_tables looks for earlier runs' tables: this run's schema and the
    one the previous run recorded in `cdclake.batch_schema` (`previous_schema`; before that property, silver's
    namespace) if it differs and its catalog is defined in this session; `previous_id`: the run that last recorded
    what it applied (`cdclake.run_id`, run_id_property). -#}
{% macro run_tables(target, properties) -%}
  {%- set id = cdclake.run_id() -%}
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
  {{ return({'id': id, 'schema': batch_schema, 'name': name, 'batch': batch_schema ~ '.' ~ name, 'schemas': schemas, 'previous_schema': previous, 'previous_id': properties.get('cdclake.run_id')}) }}
{%- endmacro %}


{#- A run's id: when the model's run began (UTC, `YYYYMMDDhhmmss`) and dbt's invocation id, in hex digits only, so
    that it fits in table and branch names. The time tells a later run whether this one may still be going
    (run_started). -#}
{% macro run_id() -%}
  {{ return(modules.datetime.datetime.now(modules.pytz.utc).strftime('%Y%m%d%H%M%S') ~ invocation_id | replace('-', '')) }}
{%- endmacro %}


{#- When the run of id `id` (run_id) began, a UTC datetime; none for the ids of older versions (the invocation id
    alone), which carry no time. -#}
{% macro run_started(id) -%}
  {#- 14 digits of time, then the invocation id's 32 hex digits. -#}
  {%- if id | length != 14 + 32 or not id[:14].isdigit() %}{{ return(none) }}{% endif -%}
  {{ return(modules.datetime.datetime.strptime(id[:14], '%Y%m%d%H%M%S').replace(tzinfo=modules.pytz.utc)) }}
{%- endmacro %}


{#- A table of this run next to its batch table (`<model>__cdc_batch_<run id>_<kind>`; layout.run_tables is the
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
  Drops the batch tables of earlier runs (`<model>__cdc_batch*`, all but this run's `keep`) in each of `run.schemas`
  (where this run's batch is and where the previous run's was, kept in `cdclake.batch_schema`; each run keeps its
  own until the next, for a look at what it applied). PURGE: Iceberg's DROP TABLE alone leaves the files in a JDBC
  or REST catalog. Called once this run's commits are done: a run that fails drops nothing.
  The tables of a run that may still be going stay: those of a run other than this one and the one that recorded
  what it applied (`run.previous_id`, which has ended) that began less than `stale_run_hours` (default 24) ago.
  Such a run overlaps this one and drops its own tables as it goes: two statements dropping one table at once can
  fail (the second finds the first's metadata gone), and in CI a run that had applied its unit failed here so. A
  run that began before this one's commit cannot apply anyway (check_not_overtaken); one that began over
  `stale_run_hours` ago is taken as killed.
  A run that did not finish may also have left its branch (`cdclake_apply_<its id>`, create_apply_branch; made
  after its batch table): that of each run whose tables are dropped here, but this one and `run.previous_id`,
  whose branches are gone, is dropped too. A branch would keep its snapshots from expiry. (Found so, rather than
  by listing silver's refs at every run: a metadata query, 0.05-0.1 s.)
-#}
{% macro drop_batch_tables(target, run, keep) -%}
  {#- The names runs give them (older versions: without the invocation, or a shorter one), and nothing else (a
      cdc_silver model may not hold `__cdc_` in its name, check_options, but another table may). Catalogs that fold
      names to lower case list them so. -#}
  {%- set batch_name = modules.re.compile(modules.re.escape(target.identifier) ~ '__cdc_batch(_(?P<run>[0-9a-f]+)(_folded|_folding|_history|_history_events|_moves|_moves_folded|_moves_folding|_moves_done|_moves_earlier|_moved[0-9]*|_types|_held(_moves|_keys[0-9]+)?)?)?', modules.re.IGNORECASE) -%}
  {%- set now = modules.datetime.datetime.now(modules.pytz.utc) -%}
  {%- set stale_after = modules.datetime.timedelta(hours=config.get('stale_run_hours', 24) | int) -%}
  {%- set this_and_previous = [run.id, run.previous_id] -%}
  {%- set unfinished = [] -%}
  {%- set going = {} -%}
  {%- for schema in run.schemas -%}
    {%- for row in run_query('show tables in ' ~ schema).rows if not row[2] and row[1] != keep -%}
      {%- set name = batch_name.fullmatch(row[1]) -%}
      {%- if name -%}
        {%- set id = (name.group('run') or '') | lower -%}
        {%- set started = cdclake.run_started(id) if id not in this_and_previous else none -%}
        {%- if started is not none and now - started < stale_after -%}
          {%- do going.update({id: started}) -%}
        {%- else -%}
          {% do run_query('drop table if exists ' ~ schema ~ '.' ~ cdclake.quote(row[1]) ~ ' purge') %}
          {%- if id and id not in this_and_previous + unfinished %}{% do unfinished.append(id) %}{% endif -%}
        {%- endif -%}
      {%- endif -%}
    {%- endfor -%}
  {%- endfor -%}
  {%- for id, started in going.items() -%}
    {{ log("cdclake: leaving the tables of run " ~ id ~ " of " ~ target ~ ", which began " ~ ((now - started).total_seconds() // 60) | int ~ " minutes ago and may still be going (the first run more than stale_run_hours after it began drops them)", info=true) }}
  {%- endfor -%}
  {%- for id in unfinished -%}
    {{ log("cdclake: dropping branch " ~ cdclake.apply_branch_prefix() ~ id ~ " of " ~ target ~ " if a run that did not finish left it", info=true) }}
    {% do cdclake.drop_apply_branch(target, cdclake.apply_branch_prefix() ~ id) %}
  {%- endfor -%}
{%- endmacro %}


{#- `, 'cdclake.run_id' = '<id>'`: this run (run_tables' `id`) recorded what it applied, its branch dropped before
    (drop_batch_tables need not drop it). -#}
{% macro run_id_property(run) -%}
  , 'cdclake.run_id' = '{{ run.id }}'
{%- endmacro %}


{#- Fails the run (dropping its branch and the tables of `run`, run_tables) if another run of the model applied
    bronze since this one read `properties`, or anything else moved silver's main: its unit of work and applied
    position are stale. (The fast-forward would fail on a moved main too; this says why, and also catches a run
    that moved main before this one read the properties but recorded its bronze snapshot after.) The tables go
    now: no other run drops them for `stale_run_hours` (drop_batch_tables). -#}
{% macro check_not_overtaken(target, properties, run, branch=none) -%}
  {%- set now = cdclake.table_properties(target) -%}
  {%- set moved = now.get('current-snapshot-id') != properties.get('current-snapshot-id') -%}
  {%- if moved or now.get('cdclake.bronze_snapshot_id') != properties.get('cdclake.bronze_snapshot_id') -%}
    {%- if branch is not none %}{% do cdclake.drop_apply_branch(target, branch) %}{% endif -%}
    {%- for row in run_query("show tables in " ~ run.schema ~ " like '" ~ run.name ~ "*'").rows if not row[2] -%}
      {% do run_query('drop table if exists ' ~ run.schema ~ '.' ~ cdclake.quote(row[1]) ~ ' purge') %}
    {%- endfor -%}
    {{ exceptions.raise_compiler_error("cdc_silver model '" ~ model.name ~ "': " ~ target ~ " changed while this run applied bronze from snapshot " ~ properties.get('cdclake.bronze_snapshot_id') ~ " (now " ~ ('at silver snapshot ' ~ now.get('current-snapshot-id') if moved else 'applied up to bronze snapshot ' ~ now.get('cdclake.bronze_snapshot_id')) ~ "): another run of the model, or a write to silver, overtook it. Nothing was applied; run it again.") }}
  {%- endif -%}
{%- endmacro %}


{#-
  A run's writes to silver are staged on a branch of its own (`cdclake_apply_<run id>`) made from the snapshot the
  run read (`properties`), then main is fast-forwarded to it (fast_forward_sql, the run's 'main' statement) and the
  branch dropped (drop_apply_branch): main moves once, from the state the run decided against to the new one, and a
  run that moved main in between makes the fast-forward fail. Returns the branch's `name` and the `relation` that
  writes to it.
-#}
{% macro create_apply_branch(target, properties, run_id) -%}
  {%- set name = cdclake.apply_branch_prefix() ~ run_id -%}
  {%- set read_snapshot = properties.get('current-snapshot-id') -%}
  {% do run_query('alter table ' ~ target ~ ' create branch ' ~ name ~ (' as of version ' ~ read_snapshot if read_snapshot not in (none, 'none') else '')) %}
  {{ return({'name': name, 'relation': target ~ '.branch_' ~ name}) }}
{%- endmacro %}


{% macro apply_branch_prefix() -%}
  {{ return('cdclake_apply_') }}
{%- endmacro %}


{% macro fast_forward_sql(target, branch) -%}
  call system.fast_forward(table => '{{ target.schema }}.{{ target.identifier }}', branch => 'main', to => '{{ branch }}')
{%- endmacro %}


{% macro drop_apply_branch(target, branch) -%}
  {% do run_query('alter table ' ~ target ~ ' drop branch if exists ' ~ branch) %}
{%- endmacro %}
