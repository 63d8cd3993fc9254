"""Fake Debezium Db2 connector (S000, reference §2.4-2.5): ASN CD-table polling, LSN positions.

Source block exactly as the seed's data events (and Debezium's ``Db2SourceInfoStructMaker``): version,
connector, name, ts_ms, snapshot, db, schema, table, change_lsn, commit_lsn. LSNs are the seed's 10-byte
``XXXXXXXX:XXXXXXXX:XXXX`` lower-case hex; every event of a transaction shares ``commit_lsn`` and ``ts_ms``
(the commit time), snapshot reads carry the snapshot LSN as ``commit_lsn`` and ``change_lsn: null``.
"""

from __future__ import annotations

from random import Random

from ingest.fakes import values as v
from ingest.fakes.base import (
    ALLOWED_V1,
    Emitted,
    RowOp,
    SnapshotStyle,
    Statement,
    canonical_key,
    common_source_fields,
    snapshot_field,
)
from ingest.fakes.connect import Column, JsonDict, optional_string
from ingest.fakes.relational import RelationalConnector, TxPositions

VERSION = "1.7.0.Final"
_FIRST_LSN = int("0000002700000758" + "0000", 16)


def format_lsn(value: int) -> str:
    """10-byte LSN as Debezium prints it: ``%08x:%08x:%04x``."""
    if not 0 <= value < 1 << 80:
        raise ValueError("a Db2 LSN has 10 bytes")
    return f"{value >> 48:08x}:{(value >> 16) & 0xFFFFFFFF:08x}:{value & 0xFFFF:04x}"


class Db2Connector(RelationalConnector):
    """``db2server.DB2INST1.CUSTOMERS`` in database ``TESTDB``."""

    connector = "db2"
    version = VERSION
    prefix = "db2server"
    database = "TESTDB"
    schema_name = "DB2INST1"
    table = "CUSTOMERS"
    key_columns = ("ID",)
    columns = (
        (Column("ID", "int32"), None),  # INTEGER NOT NULL PRIMARY KEY
        (Column("FIRST_NAME", "string"), v.first_name),  # VARCHAR(255) NOT NULL
        (Column("LAST_NAME", "string"), v.last_name),
        (Column("EMAIL", "string"), v.email),
        (Column("BALANCE", "decimal", precision=12, scale=2), v.decimal(12, 2)),  # DECIMAL(12,2) NOT NULL
        (Column("BIRTH_DATE", "date", optional=True), v.birth_date(nullable=True)),  # DATE
        (Column("CREATED_AT", "micro_timestamp"), v.naive_timestamp(1)),  # TIMESTAMP(6) NOT NULL
        (Column("VISITS", "int64"), v.integer(0, 9_000_000_000)),  # BIGINT NOT NULL
        (Column("RATING", "double", optional=True), v.quarter_steps(nullable=True)),  # DOUBLE
        (Column("TIER", "int16"), v.integer(0, 5)),  # SMALLINT NOT NULL
    )

    def __init__(self, snapshot_style: SnapshotStyle) -> None:
        super().__init__(snapshot_style, initial_log=_FIRST_LSN, initial_tx=0)

    def source_fields(self) -> list[JsonDict]:
        return [
            *common_source_fields(snapshot_field(self.snapshot_style, allowed=ALLOWED_V1)),
            optional_string("change_lsn"),
            optional_string("commit_lsn"),
        ]

    def _source(self, ts_ms: int, marker: object, change: str | None, commit: str) -> JsonDict:
        return {
            **self.source_head(ts_ms, marker),
            "change_lsn": change,
            "commit_lsn": commit,
        }

    def snapshot_source(self, ts_ms: int, marker: object, snapshot_pos: int) -> JsonDict:
        return self._source(ts_ms, marker, None, format_lsn(snapshot_pos))

    def change_source(self, ts_ms: int, tx: TxPositions, change: int) -> JsonDict:
        return self._source(ts_ms, self.streaming_marker(), format_lsn(change), format_lsn(tx.commit))

    def transaction(self, rng: Random, statements: list[Statement]) -> list[Emitted]:
        return super().transaction(rng, self._paired(statements))

    def _paired(self, statements: list[Statement]) -> list[Statement]:
        """As Debezium's Db2 connector reads a commit's CD-table rows (reference.md 2.1, LuwPlatform's query): a
        delete directly followed by an insert is taken for the two halves of one update (the capture stores every
        update so). Of one key: an update. Of two keys: a primary-key change (a delete and a create at one position,
        with their headers)."""
        out: list[Statement] = []
        for statement in statements:
            if out and _lone(out[-1], "d") and _lone(statement, "c"):
                (gone,), (made,) = out[-1], statement
                assert gone.before is not None
                assert made.after is not None
                same = canonical_key(self.key_payload(gone.before)) == canonical_key(self.key_payload(made.after))
                out[-1] = (RowOp("u", gone.before, made.after),) if same else (gone, made)
            else:
                out.append(statement)
        return out

    def tx_ids(self, tx: TxPositions) -> tuple[str, str, str]:
        """Db2 transaction ids are LSN-shaped (seed: ``00000025:00000d08:0025``): the commit LSN."""
        tx_id = format_lsn(tx.commit)
        return tx_id, tx_id, tx_id


def _lone(statement: Statement, op: str) -> bool:
    return len(statement) == 1 and statement[0].op == op
