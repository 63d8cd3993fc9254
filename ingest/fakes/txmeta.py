"""Transaction metadata (``provide.transaction.metadata=true``): BEGIN/END records and the envelope block.

Two generations exist: Debezium 1.x (Db2, Oracle 1.5, MongoDB 1.9: unnamed block, no ``ts_ms`` on BEGIN/END) and
2.x+ (Informix 2.7: named ``event.block``/``event.collection`` schemas with versions, ``ts_ms`` on BEGIN/END).
Consumers must accept both, so the fakes emit both.
"""

from __future__ import annotations

from dataclasses import dataclass

from ingest.fakes.connect import JsonDict, array, field, required, schema, serialize, struct

KEY_NAME = "io.debezium.connector.common.TransactionMetadataKey"
VALUE_NAME = "io.debezium.connector.common.TransactionMetadataValue"


@dataclass(frozen=True, slots=True)
class TxMetaStyle:
    """Which Debezium generation's transaction schemas to write."""

    v2: bool

    def block_schema(self) -> JsonDict:
        """The envelope's optional ``transaction`` field schema."""
        fields = [
            required("string", "id"),
            required("int64", "total_order"),
            required("int64", "data_collection_order"),
        ]
        if self.v2:
            return field("transaction", struct(fields, optional=True, name="event.block", version=1))
        return field("transaction", struct(fields, optional=True))

    def key_schema(self) -> JsonDict:
        return struct([required("string", "id")], optional=False, name=KEY_NAME, version=1 if self.v2 else None)

    def value_schema(self) -> JsonDict:
        per_collection = [required("string", "data_collection"), required("int64", "event_count")]
        if self.v2:
            item = struct(per_collection, optional=True, name="event.collection", version=1)
        else:
            item = struct(per_collection, optional=False)
        fields = [
            required("string", "status"),
            required("string", "id"),
            field("event_count", schema("int64", optional=True)),
            field("data_collections", array(item, optional=True)),
        ]
        if self.v2:
            fields.append(required("int64", "ts_ms"))
        return struct(fields, optional=False, name=VALUE_NAME, version=1 if self.v2 else None)

    def key(self, tx_id: str) -> bytes:
        return serialize(self.key_schema(), {"id": tx_id})

    def begin(self, tx_id: str, ts_ms: int) -> bytes:
        payload: JsonDict = {"status": "BEGIN", "id": tx_id, "event_count": None, "data_collections": None}
        if self.v2:
            payload["ts_ms"] = ts_ms
        return serialize(self.value_schema(), payload)

    def end(self, tx_id: str, ts_ms: int, counts: list[tuple[str, int]]) -> bytes:
        payload: JsonDict = {
            "status": "END",
            "id": tx_id,
            "event_count": sum(n for _, n in counts),
            "data_collections": [{"data_collection": name, "event_count": n} for name, n in counts],
        }
        if self.v2:
            payload["ts_ms"] = ts_ms
        return serialize(self.value_schema(), payload)


def block(tx_id: str, total_order: int, data_collection_order: int) -> JsonDict:
    """The ``transaction`` value of one data event (orders are 1-based, emitted as JSON numbers)."""
    return {"id": tx_id, "total_order": total_order, "data_collection_order": data_collection_order}
