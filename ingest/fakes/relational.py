"""Shared machinery of the relational fakes (Db2, Informix, Oracle): schemas, positions, envelopes.

Positions come from one log counter per connector. Each transaction gets a begin record, one position per
statement and a commit position after them; commits are strictly increasing (topic order = commit order, as all
three connectors emit at commit). A transaction may *begin* before the previous one commits (its first change
sits between the previous transaction's last change and its commit) so that consumers that order by change
position alone, instead of (commit, change), are caught out.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass
from random import Random

from ingest.fakes.base import BASE_MS, Emitted, Row, RowOp, SnapshotStyle, Statement, canonical_key, snapshot_marker
from ingest.fakes.connect import Column, JsonDict, field, schema, serialize, struct
from ingest.fakes.txmeta import TxMetaStyle, block
from ingest.fakes.values import Gen

# The Kafka headers Debezium puts on the two halves of a primary-key change, the other half's key as its key
# converter writes it (tests/fixtures/debezium/postgres: real output).
OLDKEY = "__debezium.oldkey"
NEWKEY = "__debezium.newkey"


@dataclass(frozen=True, slots=True)
class TxPositions:
    """Log positions and source times allocated to one transaction."""

    seq: int
    begin: int
    changes: tuple[int, ...]
    commit: int
    begin_ms: int
    change_ms: tuple[int, ...]
    commit_ms: int


class RelationalConnector(abc.ABC):
    """A fake relational connector for one table; subclasses supply names, columns and the source block."""

    connector: str
    version: str
    prefix: str
    database: str
    schema_name: str
    table: str
    columns: tuple[tuple[Column, Gen | None], ...]  # generator None = key column (value = key id)
    key_columns: tuple[str, ...]
    tx_style: TxMetaStyle = TxMetaStyle(v2=False)
    change_step: tuple[int, int] = (1, 4)  # log distance between statements of one transaction
    pk_change_is_one_statement = True

    def __init__(self, snapshot_style: SnapshotStyle, initial_log: int, initial_tx: int) -> None:
        self.snapshot_style = snapshot_style
        self.log = initial_log
        self.tx_seq = initial_tx
        self.clock_ms = BASE_MS
        self.proc_ms = BASE_MS
        self.prev_commit: int | None = None
        self.prev_last_change = 0
        self.prev_keys: frozenset[str] = frozenset()
        self._key_schema = self._build_key_schema()
        self._value_schema = self._build_value_schema()

    # --- names -------------------------------------------------------------------------------------------
    @property
    def name(self) -> str:
        return self.connector

    @property
    def data_topic(self) -> str:
        return f"{self.prefix}.{self.schema_name}.{self.table}"

    @property
    def transaction_topic(self) -> str:
        return f"{self.prefix}.transaction"

    @property
    def data_collection(self) -> str:
        return f"{self.database}.{self.schema_name}.{self.table}"

    # --- schemas -----------------------------------------------------------------------------------------
    def _build_key_schema(self) -> JsonDict:
        fields = [col.connect_schema() for col, _ in self.columns if col.name in self.key_columns]
        return struct(fields, optional=False, name=f"{self.data_topic}.Key")

    def _row_schema(self, name: str) -> JsonDict:
        fields = [col.connect_schema() for col, _ in self.columns]
        return field(name, struct(fields, optional=True, name=f"{self.data_topic}.Value"))

    def _build_value_schema(self) -> JsonDict:
        fields = [
            self._row_schema("before"),
            self._row_schema("after"),
            field("source", struct(self.source_fields(), optional=False, name=self.source_schema_name)),
            *self.trailer_fields(),
        ]
        return struct(fields, optional=False, name=f"{self.data_topic}.Envelope")

    @property
    def source_schema_name(self) -> str:
        return f"io.debezium.connector.{self.connector}.Source"

    def trailer_fields(self) -> list[JsonDict]:
        """Envelope fields after ``source`` (1.x layout: op, ts_ms, transaction)."""
        return [
            field("op", schema("string", optional=False)),
            field("ts_ms", schema("int64", optional=True)),
            self.tx_style.block_schema(),
        ]

    @abc.abstractmethod
    def source_fields(self) -> list[JsonDict]: ...

    def source_head(self, ts_ms: int, marker: object, *, fine_clocks: bool = False) -> JsonDict:
        """The values of the ``source`` fields every connector starts with (``common_source_fields``), in order;
        ``fine_clocks``: ``ts_us`` and ``ts_ns`` after ``ts_ms`` (Debezium 2.x)."""
        clocks = {"ts_us": ts_ms * 1000, "ts_ns": ts_ms * 1_000_000} if fine_clocks else {}
        return {
            "version": self.version,
            "connector": self.connector,
            "name": self.prefix,
            "ts_ms": ts_ms,
            **clocks,
            "snapshot": marker,
            "db": self.database,
            "schema": self.schema_name,
            "table": self.table,
        }

    @abc.abstractmethod
    def snapshot_source(self, ts_ms: int, marker: object, snapshot_pos: int) -> JsonDict: ...

    @abc.abstractmethod
    def change_source(self, ts_ms: int, tx: TxPositions, change: int) -> JsonDict: ...

    @abc.abstractmethod
    def tx_ids(self, tx: TxPositions) -> tuple[str, str, str]:
        """(BEGIN id, END id, id in data events)."""

    def streaming_marker(self) -> object:
        return snapshot_marker(self.snapshot_style, None, 0)

    # --- rows --------------------------------------------------------------------------------------------
    def new_row(self, rng: Random, key_id: int) -> Row:
        return {col.name: key_id if gen is None else gen(rng, key_id) for col, gen in self.columns}

    def changed_row(self, rng: Random, row: Row) -> Row:
        mutable = [(col, gen) for col, gen in self.columns if gen is not None]
        changed = dict(row)
        for col, gen in rng.sample(mutable, rng.randint(1, min(3, len(mutable)))):
            assert gen is not None
            value = gen(rng, int(str(row[self.key_columns[0]])))
            changed[col.name] = value
        return changed

    def with_key(self, row: Row, key_id: int) -> Row:
        return {**row, self.key_columns[0]: key_id}

    def key_payload(self, row: Row) -> JsonDict:
        return {col.name: col.encode(row[col.name]) for col, _ in self.columns if col.name in self.key_columns}

    def after_payload(self, row: Row) -> JsonDict:
        return {col.name: col.encode(row[col.name]) for col, _ in self.columns}

    # --- clocks and positions ----------------------------------------------------------------------------
    def _processing_ms(self, rng: Random, source_ms: int) -> int:
        """Connector processing time: after the source time, never going backwards."""
        self.proc_ms = max(self.proc_ms + rng.randint(1, 5), source_ms + rng.randint(80, 2500))
        return self.proc_ms

    def _allocate(self, rng: Random, statements: list[Statement]) -> TxPositions:
        keys = frozenset(canonical_key(self.key_payload(r)) for s in statements for op in s for r in _rows(op))
        first_keys = frozenset(canonical_key(self.key_payload(r)) for op in statements[0] for r in _rows(op))
        prev_commit = self.prev_commit
        overlap = (
            prev_commit is not None
            and prev_commit - self.prev_last_change >= 3
            and not (first_keys & self.prev_keys)
            and rng.random() < 0.3
        )
        if overlap:
            begin = self.prev_last_change + 1
            changes = [begin + 1]
        else:
            begin = self.log + rng.randint(1, 3)
            changes = [begin + rng.randint(1, 3)]
        low, high = self.change_step
        for _ in statements[1:]:
            base, step = changes[-1], rng.randint(low, high)
            if prev_commit is not None and base < prev_commit:  # row locks: later statements follow that commit
                base, step = prev_commit, max(step, 1)
            changes.append(base + step)
        commit = max(changes[-1], prev_commit or 0) + rng.randint(2, 8)
        self.log = commit
        self.prev_commit, self.prev_last_change, self.prev_keys = commit, changes[-1], keys
        self.tx_seq += rng.randint(1, 3)
        begin_ms = self.clock_ms + rng.randint(5, 4000)
        change_ms = [begin_ms]
        for _ in statements[1:]:
            change_ms.append(change_ms[-1] + rng.randint(0, 40))
        commit_ms = change_ms[-1] + rng.randint(1, 30)
        self.clock_ms = commit_ms
        return TxPositions(self.tx_seq, begin, tuple(changes), commit, begin_ms, tuple(change_ms), commit_ms)

    # --- events ------------------------------------------------------------------------------------------
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
        """The value payload in 1.x field order; Informix overrides for 2.x."""
        return {
            "before": None if before is None else self.after_payload(before),
            "after": None if after is None else self.after_payload(after),
            "source": source,
            "op": op,
            "ts_ms": ts_ms,
            "transaction": tx,
        }

    def _key_bytes(self, row: Row) -> bytes:
        return serialize(self._key_schema, self.key_payload(row))

    def snapshot(self, rng: Random, rows: list[Row]) -> list[Emitted]:
        """Initial snapshot: one ``r`` per row, all at the position read before the scan, no transactions."""
        snapshot_pos = self.log
        out: list[Emitted] = []
        for index, row in enumerate(rows):
            self.clock_ms += rng.randint(0, 3)
            marker = snapshot_marker(self.snapshot_style, index, len(rows), v2=self.tx_style.v2)
            source = self.snapshot_source(self.clock_ms, marker, snapshot_pos)
            ts = self._processing_ms(rng, self.clock_ms)
            value = self.envelope("r", None, row, source, ts, None, rng)
            out.append(Emitted(self.data_topic, self._key_bytes(row), serialize(self._value_schema, value), ts))
        self.log += rng.randint(1, 5)
        return out

    def transaction(self, rng: Random, statements: list[Statement]) -> list[Emitted]:
        """One committed transaction: BEGIN, its change events (+ tombstones), END."""
        tx = self._allocate(rng, statements)
        begin_id, end_id, data_id = self.tx_ids(tx)
        out = [
            Emitted(
                self.transaction_topic,
                self.tx_style.key(begin_id),
                self.tx_style.begin(begin_id, tx.begin_ms),
                self._processing_ms(rng, tx.begin_ms),
            )
        ]
        order = 0
        for statement, change, change_ms in zip(statements, tx.changes, tx.change_ms, strict=True):
            moved = _moved(statement)
            for row_op in statement:
                order += 1
                source = self.change_source(self.source_ms(tx, change_ms), tx, change)
                ts = self._processing_ms(rng, tx.commit_ms)
                value = self.envelope(
                    row_op.op, row_op.before, row_op.after, source, ts, block(data_id, order, order), rng
                )
                key = self._key_bytes(_identity(row_op))
                headers: tuple[tuple[str, bytes | None], ...] = ()
                if moved is not None:  # Debezium's RelationalChangeRecordEmitter: each half names the other key
                    old, new = moved
                    headers = (
                        ((NEWKEY, self._key_bytes(new)),) if row_op.op == "d" else ((OLDKEY, self._key_bytes(old)),)
                    )
                out.append(Emitted(self.data_topic, key, serialize(self._value_schema, value), ts, headers))
                if row_op.op == "d":
                    out.append(Emitted(self.data_topic, key, None, ts, headers))  # the tombstone keeps them
        end = self.tx_style.end(end_id, tx.commit_ms, [(self.data_collection, order)])
        out.append(
            Emitted(self.transaction_topic, self.tx_style.key(end_id), end, self._processing_ms(rng, tx.commit_ms))
        )
        return out

    def source_ms(self, tx: TxPositions, change_ms: int) -> int:
        """``source.ts_ms`` of a change: the commit time by default (Db2, Informix)."""
        return tx.commit_ms


def _moved(statement: Statement) -> tuple[Row, Row] | None:
    """The old and new rows of a primary-key change (one statement: delete of the old key, create of the new)."""
    if len(statement) != 2:
        return None
    gone, made = statement
    if gone.op != "d" or made.op != "c" or gone.before is None or made.after is None:
        return None
    return gone.before, made.after


def _rows(op: RowOp) -> tuple[Row, ...]:
    return tuple(r for r in (op.before, op.after) if r is not None)


def _identity(op: RowOp) -> Row:
    row = op.after if op.after is not None else op.before
    assert row is not None
    return row
