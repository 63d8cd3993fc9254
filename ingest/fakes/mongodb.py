"""Fake Debezium MongoDB connector 1.9 in ``capture.mode=change_streams_update_full`` (S004, reference §5.4-5.5).

What makes it MongoDB rather than relational:
- the key is ``{"id": <strict extended JSON of _id>}`` (int, string and ObjectId ids all occur);
- ``after`` is an extended-JSON *string*; there is no ``before``; deletes carry no document at all, so the key
  is the only identity; ``patch``/``filter`` are null in change-streams mode;
- updates carry ``updateDescription`` and a full ``after`` that is *looked up* after the transaction committed
  (so several updates of one document in a transaction all show its final state, or ``null`` if the transaction
  deleted it), as the seed warns;
- position is the cluster time: ``source.ts_ms`` = seconds * 1000 and ``ord`` = increment in that second. All
  events of one multi-document transaction share it (and ``lsid``/``txnNumber``), so ``transaction.total_order``
  (or the Kafka offset) orders them. Single writes are not transactions: no BEGIN/END, ``transaction: null``.

``capture_mode="change_streams"`` (not the default) gives updates without ``after``: only ``updateDescription``,
written as a driver's dotted-path update would show it (``address.city`` for one field of a sub-document, ``tags.3``
for an element, ``truncatedArrays`` for a shortened array, ``removedFields`` for an unset field).
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal
from random import Random

import orjson

from ingest.fakes import values as v
from ingest.fakes.base import (
    ALLOWED_V1,
    BASE_MS,
    Emitted,
    Row,
    RowOp,
    SnapshotStyle,
    Statement,
    canonical_key,
    common_source_fields,
    snapshot_field,
    snapshot_marker,
)
from ingest.fakes.connect import (
    JSON,
    JsonDict,
    array,
    field,
    optional_string,
    required,
    schema,
    serialize,
    struct,
    utc_ms,
)
from ingest.fakes.extjson import Binary, DateTime, Decimal128, Int64, ObjectId, dumps, key_id
from ingest.fakes.txmeta import TxMetaStyle, block

VERSION = "1.9.7.Final"
UPDATE_DESCRIPTION = "io.debezium.connector.mongodb.changestream.updatedescription"
TRUNCATED_ARRAY = "io.debezium.connector.mongodb.changestream.truncatedarray"
_CITIES = (("Berlin", "10115"), ("Lyon", "69001"), ("Osaka", "530-0001"), ("Austin", "73301"), ("Pune", "411001"))
_TAGS = ("vip", "newsletter", "b2b", "churn-risk", "beta")
_MUTABLE = ("email", "balance", "visits", "address", "tags", "nickname")
CAPTURE_MODES = ("change_streams_update_full", "change_streams")


def document_id(key: int) -> object:
    """The ``_id`` of the document for scenario key ``key``: mostly int32, some strings and ObjectIds."""
    if key % 7 == 3:
        return f"C{key}"
    if key % 7 == 5:
        return ObjectId(f"{0x65A4F000 + key:08x}a1b2c3d4e5{key & 0xFFFFFF:06x}")
    return key


def _json_field(name: str) -> JsonDict:
    return field(name, schema("string", optional=True, name=JSON, version=1))


class MongoDbConnector:
    """``fulfillment.inventory.customers`` on replica set ``rs0``."""

    name = "mongodb"
    prefix = "fulfillment"
    database = "inventory"
    replica_set = "rs0"
    collection = "customers"
    pk_change_is_one_statement = False  # _id is immutable: a "key change" is a delete plus an insert
    tx_style = TxMetaStyle(v2=False)

    def __init__(self, snapshot_style: SnapshotStyle, capture_mode: str = "change_streams_update_full") -> None:
        if capture_mode not in CAPTURE_MODES:
            raise ValueError(f"capture_mode must be one of {CAPTURE_MODES}, not {capture_mode!r}")
        self.snapshot_style = snapshot_style
        self.capture_mode = capture_mode
        self.clock_ms = BASE_MS
        self.proc_ms = BASE_MS
        self.sec = BASE_MS // 1000
        self.ord = 0
        self.txn_number = 0
        session = Random("cdclake-fakes:mongodb:session")  # noqa: S311 - fake data, not security
        self.lsid = dumps(
            {
                "id": Binary(session.randbytes(16), 4),
                "uid": Binary(session.randbytes(32), 0),
            }
        )
        self._key_schema = struct([required("string", "id")], optional=False, name=f"{self.data_topic}.Key")
        self._value_schema = self._build_value_schema()

    @property
    def data_topic(self) -> str:
        return f"{self.prefix}.{self.database}.{self.collection}"

    @property
    def transaction_topic(self) -> str:
        return f"{self.prefix}.transaction"

    @property
    def data_collection(self) -> str:
        return f"{self.replica_set}.{self.database}.{self.collection}"

    def _build_value_schema(self) -> JsonDict:
        truncated = struct(
            [required("string", "field"), required("int32", "size")], optional=False, name=TRUNCATED_ARRAY
        )
        update_description = struct(
            [
                field("removedFields", array(schema("string", optional=False), optional=True)),
                _json_field("updatedFields"),
                field("truncatedArrays", array(truncated, optional=True)),
            ],
            optional=True,
            name=UPDATE_DESCRIPTION,
        )
        source = [
            *common_source_fields(
                snapshot_field(self.snapshot_style, allowed=ALLOWED_V1), location=("db", "rs", "collection")
            ),
            required("int32", "ord"),
            field("h", schema("int64", optional=True)),
            field("tord", schema("int64", optional=True)),
            optional_string("stxnid"),
            optional_string("lsid"),
            field("txnNumber", schema("int64", optional=True)),
        ]
        fields = [
            _json_field("after"),
            _json_field("patch"),
            _json_field("filter"),
            field("updateDescription", update_description),
            field("source", struct(source, optional=False, name="io.debezium.connector.mongo.Source")),
            field("op", schema("string", optional=True)),
            field("ts_ms", schema("int64", optional=True)),
            self.tx_style.block_schema(),
        ]
        return struct(fields, optional=False, name=f"{self.data_topic}.Envelope")

    # --- documents ---------------------------------------------------------------------------------------
    def new_row(self, rng: Random, key: int) -> Row:
        city, zip_code = rng.choice(_CITIES)
        doc: Row = {
            "_id": document_id(key),
            "first_name": v.first_name(rng, key),
            "last_name": v.last_name(rng, key),
            "email": v.email(rng, key),
            "balance": _balance(rng),
            "birth_date": _birth_date(rng),
            "visits": Int64(rng.randrange(0, 9_000_000_000)),
            "address": {"city": city, "zip": zip_code},
            "tags": rng.sample(_TAGS, rng.randint(0, 3)),
        }
        if rng.random() < 0.4:
            doc["nickname"] = v.first_name(rng, key)
        return doc

    def changed_row(self, rng: Random, row: Row) -> Row:
        """A ``$set``/``$unset`` of one to three fields (an unset nickname shows up in ``removedFields``)."""
        changed = dict(row)
        for name in rng.sample(_MUTABLE, rng.randint(1, 3)):
            if name == "nickname":
                if "nickname" in changed and rng.random() < 0.5:
                    del changed["nickname"]
                else:
                    changed["nickname"] = v.first_name(rng, 0)
            elif name == "email":
                local = str(row["email"]).split(".", 1)[0]
                changed["email"] = f"{local}.{rng.randrange(10_000):04d}@example.org"
            elif name == "balance":
                changed["balance"] = _balance(rng)
            elif name == "visits":
                changed["visits"] = Int64(_as_int64(row["visits"]) + rng.randint(1, 50))
            elif name == "address":
                city, zip_code = rng.choice(_CITIES)
                changed["address"] = {"city": city, "zip": zip_code}
            else:
                changed["tags"] = rng.sample(_TAGS, rng.randint(0, 3))
        if changed == row:
            changed["visits"] = Int64(_as_int64(row["visits"]) + 1)
        return changed

    def with_key(self, row: Row, key: int) -> Row:
        return {"_id": document_id(key), **{k: val for k, val in row.items() if k != "_id"}}

    def key_payload(self, row: Row) -> JsonDict:
        return {"id": key_id(row["_id"])}

    def after_payload(self, row: Row) -> JsonDict:
        parsed = orjson.loads(dumps(row))
        assert isinstance(parsed, dict)
        return parsed

    # --- events ------------------------------------------------------------------------------------------
    def _source(self, marker: object, txn: bool) -> JsonDict:
        return {
            "version": VERSION,
            "connector": "mongodb",
            "name": self.prefix,
            "ts_ms": self.sec * 1000,
            "snapshot": marker,
            "db": self.database,
            "rs": self.replica_set,
            "collection": self.collection,
            "ord": self.ord,
            "h": None,
            "tord": None,
            "stxnid": None,
            "lsid": self.lsid if txn else None,
            "txnNumber": self.txn_number if txn else None,
        }

    def _tick(self, rng: Random) -> None:
        """Advance the cluster time to the next oplog entry."""
        self.clock_ms += rng.randint(0, 1500)
        sec = self.clock_ms // 1000
        if sec > self.sec:
            self.sec, self.ord = sec, 1
        else:
            self.ord += 1

    def _processing_ms(self, rng: Random) -> int:
        self.proc_ms = max(self.proc_ms + rng.randint(1, 5), self.sec * 1000 + rng.randint(80, 2500))
        return self.proc_ms

    def _value(
        self, op: str, after: str | None, description: JsonDict | None, source: JsonDict, ts: int, tx: JsonDict | None
    ) -> bytes:
        payload = {
            "after": after,
            "patch": None,
            "filter": None,
            "updateDescription": description,
            "source": source,
            "op": op,
            "ts_ms": ts,
            "transaction": tx,
        }
        return serialize(self._value_schema, payload)

    def _key_bytes(self, row: Row) -> bytes:
        return serialize(self._key_schema, self.key_payload(row))

    def snapshot(self, rng: Random, rows: list[Row]) -> list[Emitted]:
        """Read events at the oplog position recorded when the snapshot started."""
        self._tick(rng)
        out: list[Emitted] = []
        for index, row in enumerate(rows):
            marker = snapshot_marker(self.snapshot_style, index, len(rows))
            ts = self._processing_ms(rng)
            value = self._value("r", dumps(row), None, self._source(marker, txn=False), ts, None)
            out.append(Emitted(self.data_topic, self._key_bytes(row), value, ts))
        return out

    def transaction(self, rng: Random, statements: list[Statement]) -> list[Emitted]:
        """One write (no metadata) or one multi-document transaction (BEGIN/END, shared cluster time)."""
        ops = [op for statement in statements for op in statement]
        txn = len(ops) > 1
        self._tick(rng)
        out: list[Emitted] = []
        tx_id = str((self.sec << 32) | self.ord)
        if txn:
            self.txn_number += 1
            out.append(
                Emitted(
                    self.transaction_topic,
                    self.tx_style.key(tx_id),
                    self.tx_style.begin(tx_id, self.sec * 1000),
                    self._processing_ms(rng),
                )
            )
        looked_up = _final_documents(self, ops)
        marker = snapshot_marker(self.snapshot_style, None, 0)
        for order, op in enumerate(ops, start=1):
            source = self._source(marker, txn)
            ts = self._processing_ms(rng)
            tx = block(tx_id, order, order) if txn else None
            row = op.after if op.after is not None else op.before
            assert row is not None
            key = self._key_bytes(row)
            if op.op == "c":
                value = self._value("c", dumps(row), None, source, ts, tx)
            elif op.op == "u":
                assert op.before is not None
                assert op.after is not None
                if self.capture_mode == "change_streams":
                    value = self._value("u", None, _dotted_update_description(op.before, op.after), source, ts, tx)
                else:
                    current = looked_up[canonical_key(self.key_payload(row))]
                    after = None if current is None else dumps(current)
                    value = self._value("u", after, _update_description(op.before, op.after), source, ts, tx)
            else:
                value = self._value("d", None, None, source, ts, tx)
            out.append(Emitted(self.data_topic, key, value, ts))
            if op.op == "d":
                out.append(Emitted(self.data_topic, key, None, ts))
        if txn:
            end = self.tx_style.end(tx_id, self.sec * 1000, [(self.data_collection, len(ops))])
            out.append(Emitted(self.transaction_topic, self.tx_style.key(tx_id), end, self._processing_ms(rng)))
        return out


def _balance(rng: Random) -> Decimal128:
    """decimal128 balance with two decimals, about a fifth negative."""
    return Decimal128(Decimal(rng.randrange(-250_000_000, 1_000_000_000)).scaleb(-2))


def _birth_date(rng: Random) -> object:
    if rng.random() < 0.125:
        return None
    day = datetime(1940, 1, 1, tzinfo=UTC) + timedelta(days=rng.randrange(365 * 65))
    return DateTime(utc_ms(day))


def _as_int64(value: object) -> int:
    assert isinstance(value, Int64)
    return value.value


def _final_documents(connector: MongoDbConnector, ops: list[RowOp]) -> dict[str, Row | None]:
    """What ``fullDocument: updateLookup`` returns after commit: each document's state at transaction end."""
    final: dict[str, Row | None] = {}
    for op in ops:
        row = op.after if op.after is not None else op.before
        assert row is not None
        final[canonical_key(connector.key_payload(row))] = op.after
    return final


def _update_description(before: Row, after: Row) -> JsonDict:
    updated = {name: value for name, value in after.items() if name not in before or before[name] != value}
    removed = [name for name in before if name not in after]
    return {
        "removedFields": removed or None,
        "updatedFields": dumps(updated) if updated else None,
        "truncatedArrays": None,
    }


def _dotted_update_description(before: Row, after: Row) -> JsonDict:
    """``updateDescription`` with dotted paths into sub-documents and arrays (``capture_mode="change_streams"``)."""
    updated: dict[str, object] = {}
    removed: list[str] = []
    truncated: list[JsonDict] = []
    _diff(before, after, "", updated, removed, truncated)
    return {
        "removedFields": removed or None,
        "updatedFields": dumps(updated) if updated else None,
        "truncatedArrays": truncated or None,
    }


def _diff(
    before: Row, after: Row, prefix: str, updated: dict[str, object], removed: list[str], truncated: list[JsonDict]
) -> None:
    removed.extend(f"{prefix}{name}" for name in before if name not in after)
    for name, value in after.items():
        old = before.get(name)
        path = f"{prefix}{name}"
        if name in before and old == value:
            continue
        if isinstance(old, dict) and isinstance(value, dict) and value:
            _diff(old, value, f"{path}.", updated, removed, truncated)
        elif isinstance(old, list) and isinstance(value, list) and value:
            if len(value) < len(old):
                truncated.append({"field": path, "size": len(value)})
            for index, item in enumerate(value):
                if index >= len(old) or old[index] != item:
                    updated[f"{path}.{index}"] = item
        else:
            updated[path] = value
