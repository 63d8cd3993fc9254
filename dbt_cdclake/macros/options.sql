{#-
  The cdc_silver options (docs/silver.md, "A model"), checked before a run reads anything: a value of the wrong
  kind fails the run naming the option (`tombstone_horizon_days='30d'` used to purge every tombstone: `| int` made
  it 0). dbt passes on every config it does not know, so an option name one or two letters off one of these (a
  typo, which would silently leave the option at its default) is a warning naming the option meant.
-#}
{% macro check_options() -%}
  {%- set prefix = "cdc_silver model '" ~ model.name ~ "': " -%}
  {#- `<model>__cdc_*` names the model's own tables (tombstones, batch tables), which its runs create and drop: a
      silver table of that name would be another model's helper, dropped by that model's next run. -#}
  {%- if '__cdc_' in model['alias'] | lower -%}
    {{ exceptions.raise_compiler_error(prefix ~ "its table name " ~ model['alias'] ~ " holds '__cdc_', which cdc_silver keeps for a model's own tables (tombstones, batch tables): another model's run could drop it; name it otherwise (alias)") }}
  {%- endif -%}
  {%- set choices = {
      'delete_mode': ['hard', 'soft'],
      'history': ['current', 'scd2'],
      'on_schema_change': ['append_new_columns', 'sync_all_columns', 'ignore', 'fail']} -%}
  {%- for option, allowed in choices.items() -%}
    {#- dbt gives every model on_schema_change='ignore' unless set: only what the model (or project) says counts. -#}
    {%- set value = config.get(option) if option != 'on_schema_change' or option in cdclake.set_options() else none -%}
    {%- if value is not none and value not in allowed -%}
      {{ exceptions.raise_compiler_error(prefix ~ option ~ " must be " ~ cdclake.quoted_list(allowed) ~ ", not " ~ cdclake.shown(value)) }}
    {%- endif -%}
  {%- endfor -%}
  {%- for option in ['keys', 'columns', 'exclude_columns'] -%}
    {%- set value = config.get(option) -%}
    {%- if value is not none and not cdclake.is_text_list(value) -%}
      {{ exceptions.raise_compiler_error(prefix ~ option ~ " must be a column name or a non-empty list of them, not " ~ cdclake.shown(value)) }}
    {%- endif -%}
  {%- endfor -%}
  {%- set value = config.get('ignore_null_updates') -%}
  {%- if value is not none and value is not boolean -%}
    {{ exceptions.raise_compiler_error(prefix ~ "ignore_null_updates must be true or false, not " ~ cdclake.shown(value)) }}
  {%- endif -%}
  {%- set value = config.get('tombstone_horizon_days') -%}
  {%- if value is not none and (value is boolean or not (value is integer or (value is string and value.isdigit())) or value | int < 0) -%}
    {{ exceptions.raise_compiler_error(prefix ~ "tombstone_horizon_days must be a whole number of days (0 or more), not " ~ cdclake.shown(value)) }}
  {%- endif -%}
  {%- set horizon = value -%}
  {%- set value = config.get('broadcast_max_changes') -%}
  {%- if value is not none and (value is boolean or not (value is integer or (value is string and value.isdigit()))) -%}
    {{ exceptions.raise_compiler_error(prefix ~ "broadcast_max_changes must be a whole number of bronze rows, not " ~ cdclake.shown(value)) }}
  {%- endif -%}
  {%- set value = horizon -%}
  {%- if value is not none and config.get('history') == 'scd2' -%}
    {{ exceptions.raise_compiler_error(prefix ~ "tombstone_horizon_days does not apply to history='scd2' (deletes are part of the history)") }}
  {%- endif -%}
  {%- set value = config.get('stale_run_hours') -%}
  {%- if value is not none and (value is boolean or not (value is integer or (value is string and value.isdigit())) or value | int < 0) -%}
    {{ exceptions.raise_compiler_error(prefix ~ "stale_run_hours must be a whole number of hours (0 or more), not " ~ cdclake.shown(value)) }}
  {%- endif -%}
  {%- set value = config.get('transaction_timeout_minutes') -%}
  {%- if value is not none and (value is boolean or not (value is integer or (value is string and value.isdigit()))) -%}
    {{ exceptions.raise_compiler_error(prefix ~ "transaction_timeout_minutes must be a whole number of minutes, not " ~ cdclake.shown(value)) }}
  {%- endif -%}
  {%- if value is not none and config.get('complete_transactions') is none -%}
    {{ exceptions.raise_compiler_error(prefix ~ "transaction_timeout_minutes applies to complete_transactions, which the model does not set") }}
  {%- endif -%}
  {%- set value = config.get('complete_transactions') -%}
  {%- if value is not none and (value is not string or value == '' or value.split('.') | length > 2) -%}
    {{ exceptions.raise_compiler_error(prefix ~ "complete_transactions must name the bronze table of the connector's transaction topic ('dbserver1_transaction', or 'schema.table'), not " ~ cdclake.shown(value)) }}
  {%- endif -%}
  {%- for option in ['exclude_changes', 'batch_catalog', 'unavailable_value'] -%}
    {%- set value = config.get(option) -%}
    {%- if value is not none and (value is not string or (value == '' and option != 'unavailable_value')) -%}
      {{ exceptions.raise_compiler_error(prefix ~ option ~ " must be " ~ ("a SQL condition" if option == 'exclude_changes' else "text") ~ ", not " ~ cdclake.shown(value)) }}
    {%- endif -%}
  {%- endfor -%}
  {%- set value = config.get('partition_by') -%}
  {%- if value is not none and not cdclake.is_text_list(value) -%}
    {{ exceptions.raise_compiler_error(prefix ~ "partition_by must be a column or partition transform (bucket(16, id), days(updated_at)), or a non-empty list of them, not " ~ cdclake.shown(value)) }}
  {%- endif -%}
  {%- set value = config.get('tblproperties') -%}
  {%- if value is not none and value is not mapping -%}
    {{ exceptions.raise_compiler_error(prefix ~ "tblproperties must be a mapping of table property names to values, not " ~ cdclake.shown(value)) }}
  {%- endif -%}
  {%- set reserved = [] -%}
  {%- for name in (value or {}).keys() if (name | string).startswith('cdclake.') %}{% do reserved.append(name) %}{% endfor -%}
  {%- if reserved -%}
    {{ exceptions.raise_compiler_error(prefix ~ "tblproperties may not set " ~ reserved | join(', ') ~ ": the cdclake.* properties are the state of silver's runs") }}
  {%- endif -%}
  {%- if (value or {}).get('format-version') not in (none, 2, '2') -%}
    {{ exceptions.warn(prefix ~ "tblproperties sets format-version " ~ value.get('format-version') ~ " (cdc_silver's default is 2): under high-churn row-level changes, format 3's deletion vectors have grown executors' memory until they failed (apache/iceberg#17241); compact silver often (cdclake maintain --layer silver)") }}
  {%- endif -%}
  {#- dbt-spark's configs of its own materializations, which a dbt user may give a cdc_silver model by habit. -#}
  {%- set elsewhere = {
      'unique_key': "cdc_silver keys its rows by `keys` (default: the Debezium key's fields)",
      'incremental_strategy': "cdc_silver applies net effect its own way",
      'merge_update_columns': "use `columns` / `exclude_columns`",
      'merge_exclude_columns': "use `columns` / `exclude_columns`",
      'incremental_predicates': "use `exclude_changes`, or a `where` in the model",
      'clustered_by': "use partition_by",
      'buckets': "use partition_by (bucket(N, column))",
      'location_root': "silver tables live in the catalog's warehouse"} -%}
  {%- for name in cdclake.set_options() if name in elsewhere -%}
    {{ exceptions.warn(prefix ~ "config '" ~ name ~ "' does not apply to cdc_silver and is ignored: " ~ elsewhere[name]) }}
  {%- endfor -%}
  {%- if (model.get('contract') or {}).get('enforced') -%}
    {{ exceptions.warn(prefix ~ "its contract is not enforced: silver's columns follow bronze's images and the model's options (docs/silver.md, \"Schema changes\"), and the shipped data tests check its rows") }}
  {%- endif -%}
  {%- if config.get('file_format') not in (none, 'iceberg') -%}
    {{ exceptions.warn(prefix ~ "file_format '" ~ config.get('file_format') ~ "' is ignored: silver tables are Iceberg tables") }}
  {%- endif -%}
  {%- set known = ['keys', 'delete_mode', 'columns', 'exclude_columns', 'ignore_null_updates', 'unavailable_value', 'exclude_changes', 'tombstone_horizon_days', 'broadcast_max_changes', 'batch_catalog', 'stale_run_hours', 'history', 'on_schema_change', 'partition_by', 'tblproperties', 'complete_transactions', 'transaction_timeout_minutes'] -%}
  {#- `key` for `keys` too; below four letters only that one (dbt's own short configs, `alias` and the like, are longer). -#}
  {%- for name in cdclake.set_options() if name not in known and (name | length >= 4 or name | lower == 'key') -%}
    {#- Names whose lengths differ by more than two are more than two edits apart: not compared. -#}
    {%- for option in known if (name | length - option | length) | abs <= 2 and cdclake.edit_distance(name | lower, option) <= 2 -%}
      {{ exceptions.warn(prefix ~ "config '" ~ name ~ "' is not a cdc_silver option and is ignored; did you mean '" ~ option ~ "'?") }}
    {%- endfor -%}
  {%- endfor -%}
{%- endmacro %}


{#- Whether a config value is a non-empty text or a non-empty list of them (column names, partition transforms). -#}
{% macro is_text_list(value) -%}
  {%- set items = [value] if value is string else value -%}
  {{ return(items is iterable and items is not mapping and items | length > 0 and not items | reject('string') | list and '' not in items) }}
{%- endmacro %}


{#- The config names the model (its config() call, its YAML, or dbt_project.yml) sets, as written. -#}
{% macro set_options() -%}
  {{ return(model.get('unrendered_config', {}).keys() | list) }}
{%- endmacro %}


{% macro quoted_list(values) -%}
  {%- set quoted = [] -%}
  {%- for value in values %}{% do quoted.append("'" ~ value ~ "'") %}{% endfor -%}
  {{- quoted[:-1] | join(', ') ~ ' or ' ~ quoted[-1] -}}
{%- endmacro %}


{#- A config value as the model wrote it: text quoted, anything else as dbt read it. -#}
{% macro shown(value) -%}
  {{- "'" ~ value ~ "'" if value is string else value | string -}}
{%- endmacro %}


{#- Levenshtein distance of two short names (the number of letters to add, drop or change). -#}
{% macro edit_distance(a, b) -%}
  {%- set state = namespace(previous=range(b | length + 1) | list) -%}
  {%- for i in range(1, a | length + 1) -%}
    {%- set current = [i] -%}
    {%- for j in range(1, b | length + 1) -%}
      {%- do current.append([state.previous[j] + 1, current[j - 1] + 1, state.previous[j - 1] + (0 if a[i - 1] == b[j - 1] else 1)] | min) -%}
    {%- endfor -%}
    {%- set state.previous = current -%}
  {%- endfor -%}
  {{ return(state.previous[-1]) }}
{%- endmacro %}
