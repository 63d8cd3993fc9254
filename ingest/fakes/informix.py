"""Fake Debezium Informix connector 2.7.4 (S001, reference §3.4-3.5): CDC API, decimal-string LSNs.

Source block exactly as the seed: version, connector, name, ts_ms, ts_us, ts_ns, snapshot, db, schema, table,
commit_lsn, change_lsn, txId, begin_lsn (LSNs and txId as decimal strings). The envelope adds ``ts_us``/``ts_ns``.
Transaction ids are ``txId:LSN`` with *different* BEGIN and END ids (BEGIN at the begin LSN, END and the data
events at the commit LSN), as in the seed. Snapshot reads: ``commit_lsn`` = snapshot LSN, the rest null.
"""

from __future__ import annotations

from random import Random

from ingest.fakes import values as v
from ingest.fakes.base import ALLOWED_V2, Row, SnapshotStyle, common_source_fields, snapshot_field
from ingest.fakes.connect import Column, JsonDict, field, optional_string, schema
from ingest.fakes.relational import RelationalConnector, TxPositions
from ingest.fakes.txmeta import TxMetaStyle

VERSION = "2.7.4.Final"
_FIRST_LSN = 627_404_540_372_400  # the seed's begin_lsn: (loguniq 146079 << 32) + position


class InformixConnector(RelationalConnector):
    """``ifxserver.informix.customers`` in database ``testdb``."""

    connector = "informix"
    version = VERSION
    prefix = "ifxserver"
    database = "testdb"
    schema_name = "informix"
    table = "customers"
    key_columns = ("id",)
    tx_style = TxMetaStyle(v2=True)
    columns = (
        (Column("id", "int32"), None),  # SERIAL PRIMARY KEY
        (Column("first_name", "string"), v.first_name),  # VARCHAR(255) NOT NULL
        (Column("last_name", "string"), v.last_name),
        (Column("email", "string"), v.email),
        (Column("balance", "decimal", precision=10, scale=2), v.decimal(10, 2)),  # DECIMAL(10,2) NOT NULL
        (Column("birth_date", "date", optional=True), v.birth_date(nullable=True)),  # DATE
        (Column("updated_at", "timestamp"), v.naive_timestamp(1000)),  # DATETIME YEAR TO FRACTION(3)
        (Column("active", "boolean"), v.boolean),  # BOOLEAN NOT NULL
        (Column("tier", "int16"), v.integer(0, 5)),  # SMALLINT NOT NULL
    )

    def __init__(self, snapshot_style: SnapshotStyle) -> None:
        super().__init__(snapshot_style, initial_log=_FIRST_LSN, initial_tx=156)

    def source_fields(self) -> list[JsonDict]:
        return [
            *common_source_fields(
                snapshot_field(self.snapshot_style, allowed=ALLOWED_V2), clocks=("ts_ms", "ts_us", "ts_ns")
            ),
            optional_string("commit_lsn"),
            optional_string("change_lsn"),
            optional_string("txId"),
            optional_string("begin_lsn"),
        ]

    def trailer_fields(self) -> list[JsonDict]:
        """2.x layout: transaction right after source, then op and the three processing times."""
        return [
            self.tx_style.block_schema(),
            field("op", schema("string", optional=False)),
            field("ts_ms", schema("int64", optional=True)),
            field("ts_us", schema("int64", optional=True)),
            field("ts_ns", schema("int64", optional=True)),
        ]

    def _source(self, ts_ms: int, marker: object, lsns: tuple[int | None, ...], tx_id: int | None) -> JsonDict:
        commit, change, begin = (None if n is None else str(n) for n in lsns)
        return {
            **self.source_head(ts_ms, marker, fine_clocks=True),
            "commit_lsn": commit,
            "change_lsn": change,
            "txId": None if tx_id is None else str(tx_id),
            "begin_lsn": begin,
        }

    def snapshot_source(self, ts_ms: int, marker: object, snapshot_pos: int) -> JsonDict:
        return self._source(ts_ms, marker, (snapshot_pos, None, None), None)

    def change_source(self, ts_ms: int, tx: TxPositions, change: int) -> JsonDict:
        return self._source(ts_ms, self.streaming_marker(), (tx.commit, change, tx.begin), tx.seq)

    def tx_ids(self, tx: TxPositions) -> tuple[str, str, str]:
        end_id = f"{tx.seq}:{tx.commit}"
        return f"{tx.seq}:{tx.begin}", end_id, end_id

    def envelope(
        self,
        op: str,
        before: Row | None,
        after: Row | None,
        source: JsonDict,
        ts_ms: int,
        tx: JsonDict | None,
        rng: Random,
    ) -> JsonDict:
        ts_us = ts_ms * 1000 + rng.randrange(1000)
        return {
            "before": None if before is None else self.after_payload(before),
            "after": None if after is None else self.after_payload(after),
            "source": source,
            "transaction": tx,
            "op": op,
            "ts_ms": ts_ms,
            "ts_us": ts_us,
            "ts_ns": ts_us * 1000 + rng.randrange(1000),
        }
