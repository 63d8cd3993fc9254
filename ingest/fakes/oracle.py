"""Fake Debezium Oracle connector 1.5 with LogMiner (S003, reference §4.4-4.5): SCN positions.

Source block: the full 1.5 shape that the seed's schema-change example shows (and ``OracleSourceInfoStructMaker``
builds): version, connector, name, ts_ms, snapshot, db, schema, table, txId, scn, commit_scn, lcr_position. The
seed's data-event examples print only a 7-field subset (kept verbatim in the seed fixtures). ``scn`` and
``commit_scn`` are decimal strings; ``txId`` is ``usn.slot.sqn`` (``6.28.807``). LogMiner buffers until commit,
so every event of a transaction shares ``commit_scn``/``txId``; several rows may share one ``scn``. Redo
timestamps have second resolution, so streamed ``source.ts_ms`` is a whole second. Snapshot reads carry the
snapshot SCN, ``commit_scn``/``txId`` null.
"""

from __future__ import annotations

from ingest.fakes import values as v
from ingest.fakes.base import ALLOWED_V1, SnapshotStyle, common_source_fields, snapshot_field
from ingest.fakes.connect import Column, JsonDict, optional_string
from ingest.fakes.relational import RelationalConnector, TxPositions

VERSION = "1.5.0.Final"
_FIRST_SCN = 2_122_000


class OracleConnector(RelationalConnector):
    """``server1.DEBEZIUM.CUSTOMERS`` in PDB ``ORCLPDB1``."""

    connector = "oracle"
    version = VERSION
    prefix = "server1"
    database = "ORCLPDB1"
    schema_name = "DEBEZIUM"
    table = "CUSTOMERS"
    key_columns = ("ID",)
    change_step = (0, 3)  # rows of one statement or close statements can share an SCN
    columns = (
        (Column("ID", "int32"), None),  # NUMBER(9,0) PRIMARY KEY: precision 9 -> INT32
        (Column("FIRST_NAME", "string"), v.first_name),  # VARCHAR2(255) NOT NULL
        (Column("LAST_NAME", "string"), v.last_name),
        (Column("EMAIL", "string"), v.email),
        (Column("BALANCE", "decimal", precision=12, scale=2), v.decimal(12, 2)),  # NUMBER(12,2) NOT NULL
        (Column("BIRTH_DATE", "timestamp", optional=True), v.date_time(nullable=True)),  # DATE -> Timestamp (ms)
        (Column("CREATED_AT", "micro_timestamp"), v.naive_timestamp(1)),  # TIMESTAMP(6) NOT NULL
        (Column("UPDATED_AT", "zoned_timestamp", optional=True), v.zoned_timestamp),  # TIMESTAMP WITH TIME ZONE
        (Column("ACTIVE", "int8"), v.integer(0, 1)),  # NUMBER(1,0) NOT NULL: precision 1 -> INT8
    )

    def __init__(self, snapshot_style: SnapshotStyle) -> None:
        super().__init__(snapshot_style, initial_log=_FIRST_SCN, initial_tx=806)

    def source_fields(self) -> list[JsonDict]:
        return [
            *common_source_fields(snapshot_field(self.snapshot_style, allowed=ALLOWED_V1)),
            optional_string("txId"),
            optional_string("scn"),
            optional_string("commit_scn"),
            optional_string("lcr_position"),
        ]

    def _source(self, ts_ms: int, marker: object, tx_id: str | None, scn: int, commit: int | None) -> JsonDict:
        return {
            **self.source_head(ts_ms, marker),
            "txId": tx_id,
            "scn": str(scn),
            "commit_scn": None if commit is None else str(commit),
            "lcr_position": None,
        }

    def snapshot_source(self, ts_ms: int, marker: object, snapshot_pos: int) -> JsonDict:
        return self._source(ts_ms, marker, None, snapshot_pos, None)

    def change_source(self, ts_ms: int, tx: TxPositions, change: int) -> JsonDict:
        return self._source(ts_ms, self.streaming_marker(), self.tx_ids(tx)[0], change, tx.commit)

    def source_ms(self, tx: TxPositions, change_ms: int) -> int:
        return change_ms - change_ms % 1000

    def tx_ids(self, tx: TxPositions) -> tuple[str, str, str]:
        """XID as ``usn.slot.sqn`` (undo segment, slot, wrap sequence)."""
        tx_id = f"{1 + tx.seq % 10}.{(tx.seq * 7) % 32}.{tx.seq}"
        return tx_id, tx_id, tx_id
