{#-
  Config complete_transactions: apply a source transaction's changes only once all of them have landed (reference
  §9 item 13; IBM CDC applies whole units of recovery). It names the bronze table of the connector's
  transaction-metadata topic (`provide.transaction.metadata=true`: `<prefix>.transaction` lands in
  `bronze.<prefix>_transaction`; `schema.table` for another schema).

  A change whose `transaction` block names a transaction is held while bronze holds fewer of that transaction's
  changes of this table (distinct `data_collection_order`s, so a replayed change counts once) than its END record
  gives for the table's data collection, or while no END has landed. The END's data collection is the one named
  `<schema>.<table>` (`<db>.<table>` or `<db>.<collection>` where the source has no schema), or ending in it:
  Debezium prefixes it with the database (SQL Server, Oracle, Db2, Informix) or the replica set (MongoDB 1.x).
  PostgreSQL's transaction ids end in a position that differs between a transaction's events and its END
  (`734:22088504`, `734:22089000`): they are matched on the transaction number before the colon.

  A held change, and the later changes of its key (held_changes_sql), stay out of everything the run
  applies; the run records, per held transaction, where the run that first held it began (where this run began,
  for one whose key holds back later changes), and the next run reads bronze again from the oldest of those
  (applying a change again is harmless: the ordering guard ignores it), so the held changes are applied by the
  first run that finds their transaction complete: even when only the transaction table has grown since (such a
  run does not take silver for up to date). Config transaction_timeout_minutes: a transaction whose first change
  landed longer ago than that is applied as it is, with a warning (an END lost, or a connector that counts
  otherwise). Without it a transaction that never completes holds its changes for good, each run warning about
  it: changes of other transactions are applied meanwhile, but for those of its keys that come after its own. A
  transaction whose first change landed before the transaction table's first record (a transaction topic ingested
  later) is not held: no END of it can be expected.
-#}

{#- The relation complete_transactions names (none without the option). Fails naming it when it does not exist. -#}
{% macro transactions_relation(bronze) -%}
  {%- set name = config.get('complete_transactions') -%}
  {%- if name is none %}{{ return(none) }}{% endif -%}
  {%- set parts = name.split('.') -%}
  {%- set schema, identifier = (parts[0], parts[1]) if parts | length == 2 else (bronze.schema, name) -%}
  {%- if not cdclake.table_exists(schema, identifier) -%}
    {{ exceptions.raise_compiler_error("cdc_silver model '" ~ model.name ~ "': complete_transactions names " ~ schema ~ "." ~ identifier ~ ", which does not exist: it is the bronze table of the connector's transaction topic (<prefix>.transaction, with provide.transaction.metadata=true), which cdclake ingest must read too") }}
  {%- endif -%}
  {{ return(api.Relation.create(database=bronze.database, schema=schema, identifier=identifier, type='table')) }}
{%- endmacro %}


{#- How a bronze row's transaction is read, typed or schemaless: {'id', 'order' (data_collection_order),
    'connector', 'collection' (its data collection as `<schema or db>.<table or collection>`)}. -#}
{% macro transaction_reading(bronze, types=none) -%}
  {%- set types = types if types is not none else cdclake.bronze_columns(bronze) -%}
  {%- if types.get('transaction', '').startswith('struct') -%}
    {%- set id, order = 'transaction.id', 'transaction.data_collection_order' -%}
  {%- else -%}
    {%- set id = "get_json_object(transaction, '$.id')" -%}
    {%- set order = "cast(get_json_object(transaction, '$.data_collection_order') as bigint)" -%}
  {%- endif -%}
  {%- set fields = cdclake.struct_field_names(bronze, 'source') if types.get('source', '').startswith('struct') else none -%}
  {%- set source = {} -%}
  {%- for name in ['connector', 'db', 'schema', 'table', 'collection'] -%}
    {%- if fields is none -%}
      {% do source.update({name: "get_json_object(source, '$." ~ name ~ "')"}) %}
    {%- else -%}
      {% do source.update({name: 'source.' ~ cdclake.quote(name) if name in fields else 'null'}) %}
    {%- endif -%}
  {%- endfor -%}
  {#- A source block without those fields (Oracle 1.x's example): the topic's last two parts, `<schema>.<table>`. -#}
  {%- set named = "concat_ws('.', coalesce(" ~ source.schema ~ ", " ~ source.db ~ "), coalesce(" ~ source.table ~ ", " ~ source.collection ~ "))" -%}
  {{ return({'id': id, 'order': order, 'connector': source.connector,
             'collection': "coalesce(nullif(" ~ named ~ ", ''), regexp_extract(_cdc_topic, '([^.]+[.][^.]+)$', 1))"}) }}
{%- endmacro %}


{#- How the transaction table's records are read: {'status', 'id', 'collections' (data_collections as an array of
    structs)}. Typed, each is a column; without schemas (`schemas.enable=false`) the record is JSON text, `payload`. -#}
{% macro end_records(transactions) -%}
  {%- set types = cdclake.bronze_columns(transactions) -%}
  {%- set array = 'array<struct<data_collection:string,event_count:bigint>>' -%}
  {%- if 'status' in types -%}
    {%- set collections = 'data_collections' if types.get('data_collections', '').startswith('array') else "from_json(data_collections, '" ~ array ~ "')" -%}
    {{ return({'status': 'status', 'id': 'id', 'collections': collections}) }}
  {%- endif -%}
  {{ return({'status': "get_json_object(payload, '$.status')", 'id': "get_json_object(payload, '$.id')",
             'collections': "from_json(get_json_object(payload, '$.data_collections'), '" ~ array ~ "')"}) }}
{%- endmacro %}


{#- A transaction id as changes and END records share it: `match` 'xid', PostgreSQL's transaction number before the
    colon (its ids end in a log position that differs between a transaction's events and its END); 'id', the id
    itself (Informix's changes carry their END's id, the others one id throughout). -#}
{% macro transaction_identity(id, match) -%}
  {{- "substring_index(" ~ id ~ ", ':', 1)" if match == 'xid' else id -}}
{%- endmacro %}


{#- The log position a PostgreSQL transaction id ends in (`734:22088504`). -#}
{% macro log_position(id) -%}
  {{- "cast(substring_index(" ~ id ~ ", ':', -1) as bigint)" -}}
{%- endmacro %}


{#- Whether a bronze row is a change of one of the transactions `ids`. -#}
{% macro of_transactions(reading, ids, match) -%}
  {%- set quoted = [] -%}
  {%- for id in ids %}{% do quoted.append(cdclake.sql_string(id)) %}{% endfor -%}
  {{- 'coalesce(' ~ cdclake.transaction_identity(reading.id, match) ~ ' in (' ~ quoted | join(', ') ~ '), false)' -}}
{%- endmacro %}


{#- What silver recorded as held (cdclake.held_transactions): {'ids': the transactions, first held first; 'since':
    per transaction, the bronze snapshot the run that first held it began after (none: all of bronze); 'from': the
    first one's, where the next run reads bronze again from; 'match': how ids are matched (transaction_identity)},
    or none when nothing is held. -#}
{% macro held_transactions(properties) -%}
  {%- set held = fromjson(properties.get('cdclake.held_transactions') or 'null') -%}
  {{ return(held if held and held.get('ids') else none) }}
{%- endmacro %}


{#- The transactions of the changes in `relation` (those `scope` keeps) that bronze's rows there do not hold all
    of, per data collection: (tx, collection, seen, ENDs found, expected, the END's collections, first landed,
    timed out, whether its first change landed before the transaction table's first record), oldest first. -#}
{% macro incomplete_transactions_sql(relation, scope, reading, ends, transactions, timeout, match) -%}
    with landed as (
      select {{ cdclake.transaction_identity(reading.id, match) }} as tx, lower({{ reading.collection }}) as collection,
        count(distinct {{ reading.order }}) as seen, min(_cdc_ingested_at) as first_landed
        {%- if match == 'xid' %}, max({{ cdclake.log_position(reading.id) }}) as last_position{% endif %}
      from {{ relation }}
      where {{ scope }}
      group by 1, 2
    ),
    ends as (
      select {{ cdclake.transaction_identity(ends.id, match) }} as tx, lower(d.data_collection) as collection, d.event_count as expected
        {%- if match == 'xid' %}, {{ cdclake.log_position(ends.id) }} as position{% endif %}
      from {{ transactions }} lateral view outer explode({{ ends.collections }}) listed as d
      where {{ ends.status }} = 'END' and {{ cdclake.transaction_identity(ends.id, match) }} in (select tx from landed)
    )
    select * from (
      select l.tx, l.collection, l.seen, count(e.tx) as ends,
        max(case when e.collection = l.collection or endswith(e.collection, '.' || l.collection) then e.expected end) as expected,
        concat_ws(', ', sort_array(collect_set(e.collection))) as listed, cast(l.first_landed as string) as first_landed,
        {% if timeout is not none %}l.first_landed < current_timestamp() - make_interval(0, 0, 0, 0, 0, {{ timeout | int }}, 0){% else %}false{% endif %} as timed_out,
        coalesce(l.first_landed < (select min(_cdc_ingested_at) from {{ transactions }}), false) as before_transactions
      from landed l
      {#- PostgreSQL's transaction numbers wrap around: the END of an earlier transaction of the same number
          comes before the changes, the END of this one after them. #}
      left join ends e on e.tx = l.tx{% if match == 'xid' %} and e.position >= l.last_position{% endif %}
      group by l.tx, l.collection, l.seen, l.first_landed
    ) where expected is null or seen < expected
    order by first_landed, tx
{%- endmacro %}


{#-
  The unit of work `changes` without the changes of transactions not complete in bronze as of snapshot `end`:
  {'changes': the relation to read, 'held': the transactions held (ids), 'property': the cdclake.held_transactions
  value to record (none when silver need not record one), 'table': the table of the run it wrote, or none}.
  `properties`: silver's, as the run read them. `scratch`: a table of the run to keep the held changes'
  coordinates in (held_changes_sql): read as a view, the query that finds them (over held_keys' rounds) would be
  planned again in every statement of the run that reads the unit, which on Spark costs seconds each, whatever
  the unit's size; the coordinates are four columns per held change, and the anti-join with them plans at once.
  Also the prefix of held_keys' tables (`<scratch>_moves`, `<scratch>_keys<N>`), dropped here once read.
-#}
{% macro without_incomplete_transactions(bronze, changes, start, end, properties, scratch=none) -%}
  {%- set recorded = none if properties.get('cdclake.held_transactions') in (none, '') else '' -%}
  {%- set transactions = cdclake.transactions_relation(bronze) -%}
  {%- set types = cdclake.bronze_columns(bronze) if transactions is not none else {} -%}
  {%- if 'transaction' not in types -%}
    {{ return({'changes': changes, 'held': [], 'property': recorded}) }}
  {%- endif -%}
  {%- set reading = cdclake.transaction_reading(bronze, types) -%}
  {%- set ends = cdclake.end_records(transactions) -%}
  {%- set timeout = config.get('transaction_timeout_minutes') -%}
  {%- set prefix = "cdc_silver model '" ~ model.name ~ "': " -%}
  {#- How ids match is the connector's: decided here, so that each side of the join computes its own. -#}
  {%- set connectors = run_query('select distinct ' ~ reading.connector ~ ' from ' ~ changes ~ ' where ' ~ reading.id ~ ' is not null').columns[0].values() | list -%}
  {%- if not connectors %}{{ return({'changes': changes, 'held': [], 'property': recorded}) }}{% endif -%}
  {%- set matches = [] -%}
  {%- for connector in connectors %}{% do matches.append('xid' if connector == 'postgresql' else 'id') %}{% endfor -%}
  {%- if matches | unique | list | length > 1 -%}
    {{ exceptions.raise_compiler_error(prefix ~ "complete_transactions: its changes come from connectors " ~ connectors | sort | join(', ') ~ ", whose transaction ids match differently; give each its own model") }}
  {%- endif -%}
  {%- set match = matches[0] -%}
  {#- Counted in the unit first: a transaction complete there is complete. Only those that are not (split across
      flushes, or replayed in part) are counted again over all of bronze, which a run need not scan otherwise. -#}
  {%- set in_unit = run_query(cdclake.incomplete_transactions_sql(changes, reading.id ~ ' is not null', reading, ends, transactions, none, match)).rows -%}
  {%- if not in_unit %}{{ return({'changes': changes, 'held': [], 'property': recorded}) }}{% endif -%}
  {%- set candidates = [] -%}
  {%- for row in in_unit %}{% do candidates.append(row[0]) %}{% endfor -%}
  {%- set scope = cdclake.of_transactions(reading, candidates | unique | list, match) -%}
  {%- set rows = run_query(cdclake.incomplete_transactions_sql(bronze ~ ' version as of ' ~ (end | int), scope, reading, ends, transactions, timeout, match)).rows -%}
  {%- set held = [] -%}
  {%- set unknowable = [] -%}
  {%- for row in rows -%}
    {%- set tx, collection, seen, ended, matched, listed, first_landed, timed_out = row[0], row[1], row[2], row[3], row[4], row[5], row[6], row[7] -%}
    {#- Landed before the transaction topic was (a topic ingested later, or records of it deleted before they
        landed): no END of it can be expected in bronze; held, it would wait for good. -#}
    {%- if row[8] %}{% do unknowable.append(tx) %}{% continue %}{% endif -%}
    {#- An END that names no data collection of this table: counting cannot work (a connector naming its data
        collections otherwise), and holding would hold for good without saying why. -#}
    {%- if ended > 0 and matched is none -%}
      {{ exceptions.raise_compiler_error(prefix ~ "transaction " ~ tx ~ " has an END record in " ~ transactions ~ " but it lists no data collection named " ~ collection ~ " or ending in ." ~ collection ~ " (it lists " ~ (listed or 'none') ~ "), so complete_transactions cannot count this table's changes of it: leave the option out of this model") }}
    {%- endif -%}
    {%- set why = ('its END has not landed in ' ~ transactions) if ended == 0 else (seen ~ ' of its ' ~ matched ~ ' changes of ' ~ collection ~ ' have landed') -%}
    {%- if timed_out -%}
      {{ exceptions.warn(prefix ~ "transaction " ~ tx ~ " is incomplete (" ~ why ~ "); its first change landed at " ~ first_landed ~ ", over transaction_timeout_minutes=" ~ timeout ~ " ago: applying what has landed") }}
    {%- elif tx not in held -%}
      {%- if held | length < 5 -%}
        {{ log("cdclake: " ~ model.alias ~ ": holding the changes of transaction " ~ tx ~ " (" ~ why ~ "; its first change landed at " ~ first_landed ~ ")", info=true) }}
      {%- endif -%}
      {% do held.append(tx) %}
    {%- endif -%}
  {%- endfor -%}
  {%- if unknowable -%}
    {{ log("cdclake: " ~ model.alias ~ ": " ~ unknowable | unique | list | length ~ " transaction(s) whose changes landed before the first record of " ~ transactions ~ " (" ~ (unknowable | unique | list)[:3] | join(', ') ~ (', ...' if unknowable | unique | list | length > 3 else '') ~ "): applied as they landed", info=true) }}
  {%- endif -%}
  {%- if not held %}{{ return({'changes': changes, 'held': [], 'property': recorded}) }}{% endif -%}
  {%- if held | length > 5 %}{{ log("cdclake: " ~ model.alias ~ ": holding " ~ held | length ~ " incomplete transactions in all", info=true) }}{% endif -%}
  {#- Each held transaction keeps the snapshot the run that first held it began after (its changes are all newer:
      an earlier run would have held or applied them); the next run reads again from the oldest of those only, so
      the re-read moves on as transactions complete. Held first is oldest (but see below): runs move forward. -#}
  {%- set before = cdclake.held_transactions(properties) or {} -%}
  {%- set since = {} -%}
  {%- set ids = [] -%}
  {%- for id in before.get('ids', []) if id in held %}{% do ids.append(id) %}{% do since.update({id: before.get('since', {}).get(id, before.get('from'))}) %}{% endfor -%}
  {%- for id in held if id not in ids %}{% do ids.append(id) %}{% do since.update({id: properties.get('cdclake.bronze_snapshot_id')}) %}{% endfor -%}
  {#- A held transaction whose keys have later changes of other transactions waiting with its own keeps where this
      run's unit began, the oldest snapshot any of them can have: those changes may have landed before its own (a
      key's changes out of order across partitions), and must be read again as long as they wait. It goes first,
      so that the first id's is still where the next run reads from. -#}
  {%- set keys = cdclake.model_key_reading(bronze, types) -%}
  {%- set pending = {'ids': ids, 'match': match} -%}
  {%- set holding = cdclake.held_keys(changes, keys, reading, pending, scratch) -%}
  {%- set holders = run_query(cdclake.key_holding_transactions_sql(changes, keys, reading, pending, holding)).columns[0].values() | list -%}
  {%- set ordered = [] -%}
  {%- for id in ids if id in holders %}{% do ordered.append(id) %}{% do since.update({id: start}) %}{% endfor -%}
  {%- for id in ids if id not in holders %}{% do ordered.append(id) %}{% endfor -%}
  {%- set state = {'from': since[ordered[0]], 'ids': ordered, 'since': since, 'match': match} -%}
  {%- set complete = cdclake.session_view('__cdc_complete') -%}
  {%- set held_changes = '(' ~ cdclake.held_changes_sql(changes, keys, reading, state, holding) ~ ')' -%}
  {%- if scratch is not none -%}
    {% do run_query('create table ' ~ scratch ~ ' using iceberg as select * from ' ~ held_changes) %}
    {%- set held_changes = scratch -%}
  {%- endif -%}
  {%- for table in holding.tables %}{% do run_query('drop table if exists ' ~ table ~ ' purge') %}{% endfor -%}
  {% do run_query('create or replace temporary view ' ~ complete ~ ' as ' ~ cdclake.without_held_changes_sql(changes, held_changes)) %}
  {{ return({'changes': complete, 'held': ordered, 'property': tojson(state), 'table': scratch}) }}
{%- endmacro %}


{#- The rows of `changes` (a relation, or a parenthesised query) but those `held_changes` lists (held_changes_sql's
    rows, as a relation or a parenthesised query). -#}
{% macro without_held_changes_sql(changes, held_changes) -%}
    select c.* from {{ changes }} c
    left anti join {{ held_changes }} h
      on c._cdc_topic <=> h.t and c._cdc_partition <=> h.pt and c._cdc_offset <=> h.f and c._cdc_order <=> h.o
{%- endmacro %}


{#- The changes of `changes` that `held` holds back, as (t, pt, f, o): their topic, partition and offset, which
    identify a bronze row (ingest skips the offsets bronze holds), and their `_cdc_order`, matched too at no cost;
    each once or more. Held back: the changes of the transactions `held` holds and, for each key one of those
    changes touches, the later changes of that key (by source position; `keys`, held_key_reading's): applied before
    the held change they follow, a partial image (a MongoDB patch, an unavailable-value placeholder) would have no
    image to fold onto, and a full one would show the key's later state before its transaction is complete. A
    change that moves a row between keys touches both (key_moves_sql), and holds back the later changes of both
    once held. They are read again with the held ones. `holding`: held_keys' (computed when none). -#}
{% macro held_changes_sql(changes, keys, reading, held, holding=none) -%}
  {%- set holding = holding if holding is not none else cdclake.held_keys(changes, keys, reading, held) -%}
  {%- set of_held = cdclake.of_transactions(reading, held.ids, held.get('match', 'id')) -%}
  {%- set waiting = '(select k, min(p) as p from (' ~ holding.held_keys ~ ') group by k)' -%}  {#- per key: where its changes begin to wait -#}
    select c._cdc_topic as t, c._cdc_partition as pt, c._cdc_offset as f, c._cdc_order as o from {{ changes }} c
    left semi join {{ waiting }} held
      on {{ cdclake.key_struct(keys.exprs) }} <=> held.k and {{ cdclake.change_position('c') }} >= held.p
    union all
    select _cdc_topic, _cdc_partition, _cdc_offset, _cdc_order from {{ changes }} c where {{ of_held }}
    {%- if holding.moves is not none %}
    union all
    select m.t, m.pt, m.f, m.p.o from ({{ holding.moves }}) m
    join {{ waiting }} h on m.k <=> h.k and m.p >= h.p
    {%- endif %}
{%- endmacro %}


{#- The held transactions (of `held`) whose changes hold back later changes of their keys in `changes`, changes of
    other transactions or of none (held_changes_sql). -#}
{% macro key_holding_transactions_sql(changes, keys, reading, held, holding) -%}
  {%- set of_held = cdclake.of_transactions(reading, held.ids, held.get('match', 'id')) -%}
    select distinct h.tx from ({{ holding.held_keys }}) h
    join (
      select {{ cdclake.key_struct(keys.exprs) }} as k, {{ cdclake.change_position('c') }} as p from {{ changes }} c where not {{ of_held }}
      {%- if holding.moves is not none %}
      union all
      select k, p from ({{ holding.moves }}) where not held
      {%- endif %}
    ) w on w.k <=> h.k and w.p >= h.p
{%- endmacro %}


{#-
  The keys the held transactions (`held`) hold back, as {'held_keys': a query of (k: a key, as key_struct; tx: the
  held transaction; p: the position from which the key's changes wait), 'moves': key_moves_sql's query, or none when
  no change of `changes` that moves a row between keys touches a held key; 'tables': the tables it left (the moves
  and the last round), for the caller to drop once it has read the two}. A held transaction holds the keys its
  changes touch, from each change's position on. A change that moves a row waits behind a held change of either
  of its keys, and then holds both keys in turn, so the keys are found in rounds: a row moved 1 -> 2 -> 3 behind a
  held change of 1 takes two.
  `scratch`: a name for tables of the run (a model run's; the shipped tests write none). With it, the moves and
  each round are written to tables, each round reading the one before; without, they are temporary views of the
  session, each round nesting the ones before it, which Spark analyses again in every statement that reads them
  (seconds a statement after a few rounds).
-#}
{% macro held_keys(changes, keys, reading, held, scratch=none) -%}
  {%- set match = held.get('match', 'id') -%}
  {%- set of_held = cdclake.of_transactions(reading, held.ids, match) -%}
  {%- set tx = cdclake.transaction_identity(reading.id, match) -%}
  {%- set own = 'select ' ~ cdclake.key_struct(keys.exprs) ~ ' as k, ' ~ tx ~ ' as tx, ' ~ cdclake.change_position('c') ~ ' as p from ' ~ changes ~ ' c where ' ~ of_held -%}
  {%- set moves = cdclake.key_moves_sql(changes, keys, reading, of_held, tx) -%}
  {%- if moves is none %}{{ return({'held_keys': own, 'moves': none, 'tables': []}) }}{% endif -%}
  {#- Each move once per key it touches (`touched`), to join it by either key with equality. -#}
  {%- set touching = 'select * from ({0}) lateral view explode(array(k, nk)) t as touched' -%}
  {#- No move touching a held transaction's own keys (its own moves touch them: their key is its change's): no
      round can find more, and the queries that read the held keys stay as small as `own` (the usual case, each
      statement that reads them planned in a fraction of the time). -#}
  {%- if run_query('select count(*) from (' ~ touching.format(moves) ~ ') m left semi join (' ~ own ~ ') h on m.touched <=> h.k and m.p >= h.p').rows[0][0] == 0 -%}
    {{ return({'held_keys': own, 'moves': none, 'tables': []}) }}
  {%- endif -%}
  {%- set tables = [] -%}
  {%- if scratch is not none -%}
    {%- do tables.append(scratch ~ '_moves') -%}
    {% do run_query('create table ' ~ tables[0] ~ ' using iceberg as ' ~ moves) %}
    {%- set moves = 'select * from ' ~ tables[0] -%}
  {%- endif -%}
  {%- set by_touched = touching.format(moves) -%}
  {#- A held transaction's own moves touch their other key too. -#}
  {%- set first = own ~ ' union select k, tx, p from (' ~ moves ~ ') where held' -%}
  {%- set state = {'query': first, 'count': none, 'relation': none} -%}
  {%- for round in range(16) -%}
    {%- set relation = cdclake.held_keys_round(state.query, round, scratch) -%}
    {%- if scratch is not none -%}
      {#- The round before is read only by this one. -#}
      {%- if round > 0 %}{% do run_query('drop table if exists ' ~ tables.pop() ~ ' purge') %}{% endif -%}
      {%- do tables.append(relation) -%}
    {%- endif -%}
    {%- set count = run_query('select count(*) from ' ~ relation).rows[0][0] -%}
    {%- if count == state.count -%}
      {{ return({'held_keys': 'select * from ' ~ relation, 'moves': moves, 'tables': tables}) }}
    {%- endif -%}
    {#- Each key held so far, and both keys of each move it holds: the round reads the one before once. -#}
    {%- do state.update({'count': count, 'relation': relation, 'query': 'select distinct s.e.k, h.tx, s.e.p from ' ~ relation ~ ' h'
      ~ ' left join (' ~ by_touched ~ ' where not held) m on m.touched <=> h.k and m.p >= h.p'
      ~ " lateral view explode(array(named_struct('k', h.k, 'p', h.p), named_struct('k', m.k, 'p', m.p), named_struct('k', m.nk, 'p', m.p))) s as e"
      ~ ' where s.e.p is not null'}) -%}
  {%- endfor -%}
  {{ exceptions.warn("cdc_silver model '" ~ model.name ~ "': complete_transactions: rows moved between keys more than 16 times behind held transactions " ~ held.ids[:3] | join(', ') ~ "; the later moves are applied without waiting for them") }}
  {{ return({'held_keys': 'select * from ' ~ state.relation, 'moves': moves, 'tables': tables}) }}
{%- endmacro %}


{#- Round `round` of held_keys' keys (`query`): a table of the run when there is `scratch`, a session view
    otherwise. -#}
{% macro held_keys_round(query, round, scratch) -%}
  {%- if scratch is none -%}
    {%- set relation = cdclake.session_view('__cdc_held_keys' ~ round) -%}
    {% do run_query('create or replace temporary view ' ~ relation ~ ' as ' ~ query) %}
  {%- else -%}
    {%- set relation = scratch ~ '_keys' ~ round -%}
    {% do run_query('create table ' ~ relation ~ ' using iceberg as ' ~ query) %}
  {%- endif -%}
  {{ return(relation) }}
{%- endmacro %}


{#- The changes of `changes` that move a row from one key to another, each with the other key, as (t, pt, f: its
    topic, partition and offset; nk: its own key; k: the other; p: its position; tx: its transaction, as `tx` reads
    it; held: whether `of_held`, a condition, holds it): a primary-key change's create and delete (marked by
    Debezium's headers, each paired with the other: moved_delete_order_sql), and an update whose images' keys differ
    (keys read from the images: it moves its row from its `before` image's key). None when bronze can hold neither. -#}
{% macro key_moves_sql(changes, keys, reading, of_held, tx) -%}
  {%- set key, position = cdclake.key_struct(keys.exprs), cdclake.change_position('c') -%}
  {%- set parts = [] -%}
  {%- if keys.headers -%}
    {%- set marked = 'select _cdc_topic as t, _cdc_partition as pt, _cdc_offset as f, _cdc_order as o, op, ' ~ reading.connector ~ ' as connector, ' ~ key ~ ' as nk, ' ~ position ~ ' as p, ' ~ tx ~ ' as tx, ' ~ of_held ~ ' as held from ' ~ changes ~ ' c where ' ~ cdclake.moved_create_sql('c.') ~ ' or ' ~ cdclake.moved_delete_sql('c.') -%}
    {%- set pairs = ' from (' ~ marked ~ ') c join (' ~ marked ~ ') d on c.t = d.t and c.op = \'c\' and d.op = \'d\' and d.o = ' ~ cdclake.moved_delete_order_sql('c.o', 'c.connector') -%}
    {%- do parts.append('select c.t, c.pt, c.f, c.nk, d.nk as k, c.p, c.tx, c.held' ~ pairs) -%}
    {%- do parts.append('select d.t, d.pt, d.f, d.nk, c.nk as k, d.p, d.tx, d.held' ~ pairs) -%}
  {%- endif -%}
  {%- if keys.moves is not none -%}
    {%- do parts.append('select _cdc_topic as t, _cdc_partition as pt, _cdc_offset as f, ' ~ key ~ ' as nk, ' ~ cdclake.key_struct(keys.old) ~ ' as k, ' ~ position ~ ' as p, ' ~ tx ~ ' as tx, ' ~ of_held ~ ' as held from ' ~ changes ~ ' c where ' ~ keys.moves) -%}
  {%- endif -%}
  {{ return(parts | join(' union all ') if parts else none) }}
{%- endmacro %}


{#- A row's key as one value: a struct of `key_exprs` (key_reading's, read from a bronze row). -#}
{% macro key_struct(key_exprs) -%}
  {%- set parts = [] -%}
  {%- for expr in key_exprs %}{% do parts.append("'k" ~ loop.index ~ "', " ~ expr) %}{% endfor -%}
  {{- 'named_struct(' ~ parts | join(', ') ~ ')' -}}
{%- endmacro %}


{#- The keys a model's rows have, as held_key_reading gives them. -#}
{% macro model_key_reading(bronze, types) -%}
  {%- set key_fields = cdclake.struct_field_names(bronze, 'key') if types.get('key', '').startswith('struct') else [] -%}
  {%- set keys = cdclake.model_keys(bronze, key_fields) -%}
  {{ return(cdclake.held_key_reading(cdclake.key_reading(bronze, keys, types, key_fields), keys, types)) }}
{%- endmacro %}


{#- key_reading's `reading` of `keys` (bronze's columns: `types`) as the held changes need it: {'exprs': the key's
    expressions in the order of `keys`; 'old': those of the key an update moves its row from, 'moves': the
    condition that it does (none: keys from the Kafka key); 'headers': whether bronze keeps Debezium's headers,
    which mark a primary-key change's delete and create}. -#}
{% macro held_key_reading(reading, keys, types) -%}
  {{ return({'exprs': cdclake.key_exprs_in_order(reading.exprs, keys), 'old': cdclake.key_exprs_in_order(reading.old_exprs, keys),
             'moves': reading.moves, 'headers': '_cdc_headers' in types}) }}
{%- endmacro %}


{#- key_reading's `exprs` (key name -> expression) as a list, in the order of `keys`. -#}
{% macro key_exprs_in_order(exprs, keys) -%}
  {%- set listed = [] -%}
  {%- for key in keys %}{% do listed.append(exprs[key]) %}{% endfor -%}
  {{ return(listed) }}
{%- endmacro %}


{#- ", 'cdclake.held_transactions' = '...'" for the run's properties commit, or '' when nothing is to record. -#}
{% macro held_transactions_property(completed) -%}
  {{- '' if completed.property is none else ", 'cdclake.held_transactions' = " ~ cdclake.sql_string(completed.property) -}}
{%- endmacro %}
