"""Deterministic change streams: an initial snapshot, then transactions of every shape the apply must survive.

The scenario is source-agnostic: it keeps the table's true state and decides what each transaction does; the
connector renders that as its wire format. ``expected`` is therefore the ground truth the silver table must
equal after replaying ``records``, whatever the source.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from random import Random

from ingest.fakes.base import SNAPSHOT_STYLES, Connector, Emitted, Row, RowOp, SnapshotStyle, Statement, canonical_key
from ingest.fakes.db2 import Db2Connector
from ingest.fakes.informix import InformixConnector
from ingest.fakes.mongodb import MongoDbConnector
from ingest.fakes.oracle import OracleConnector
from ingest.fakes.partitioner import partition_for
from ingest.fakes.records import KafkaRecord

SOURCES = ("db2", "informix", "oracle", "mongodb")
FIRST_KEY = 1001
# Always generated first (when n_changes > 0), so every stream has each shape at least once.
REQUIRED_KINDS = ("insert", "update", "delete", "pk_change", "same_key", "multi_row")
_WEIGHTS = {"insert": 2.0, "update": 4.0, "delete": 1.5, "pk_change": 0.5, "same_key": 1.0, "multi_row": 2.0}


def make_connector(source: str, snapshot_style: SnapshotStyle = "seed", capture_mode: str | None = None) -> Connector:
    """A fresh fake connector for ``source`` (one of :data:`SOURCES`); ``capture_mode`` is MongoDB's."""
    if capture_mode is not None and source != "mongodb":
        raise ValueError("capture_mode applies to the mongodb source only")
    if snapshot_style not in SNAPSHOT_STYLES:
        raise ValueError(f"snapshot_style must be one of {SNAPSHOT_STYLES}, not {snapshot_style!r}")
    if source == "db2":
        return Db2Connector(snapshot_style)
    if source == "informix":
        return InformixConnector(snapshot_style)
    if source == "oracle":
        return OracleConnector(snapshot_style)
    if source == "mongodb":
        return MongoDbConnector(snapshot_style, capture_mode or "change_streams_update_full")
    raise ValueError(f"unknown source {source!r}; expected one of {SOURCES}")


@dataclass
class ScenarioState:
    """Everything needed to continue a stream exactly where it stopped (opaque to callers)."""

    rng: Random
    connector: Connector
    partitions: int
    table: dict[int, Row]
    deleted: list[int]
    next_id: int
    offsets: dict[tuple[str, int], int]


@dataclass
class FakeStream:
    """Records in emission order plus the source table's final state they must reproduce.

    ``expected`` maps the canonical key JSON to the after-image payload as emitted (JSON-level values; for
    MongoDB the parsed extended-JSON ``after`` document); ``rows`` maps it to the source row itself, the Python
    values the generator drew (Decimal, date, datetime, ...) before any connector encoded them: what a check of
    silver compares with, so that it does not go through the decoding it checks. ``records[appended_from:]`` are
    the records added by the call that returned this stream (all of them for :func:`build_stream`).
    """

    source: str
    records: list[KafkaRecord]
    expected: dict[str, dict[str, object]]
    data_topic: str
    transaction_topic: str
    appended_from: int = 0
    state: ScenarioState | None = field(default=None, repr=False, compare=False)
    rows: dict[str, Row] = field(default_factory=dict, repr=False, compare=False)

    @property
    def new_records(self) -> list[KafkaRecord]:
        return self.records[self.appended_from :]


def build_stream(
    source: str,
    *,
    seed: int = 0,
    n_keys: int = 20,
    n_changes: int = 100,
    partitions: int = 1,
    snapshot_style: SnapshotStyle = "seed",
    capture_mode: str | None = None,
) -> FakeStream:
    """Snapshot ``n_keys`` rows, then at least ``n_changes`` row changes in transactions.

    ``snapshot_style="seed"`` writes ``source.snapshot`` as the seeds' boolean; ``"enum"`` as the real
    connectors' ``io.debezium.data.Enum`` string (``"true"``/``"last"``/``"false"``, Informix also ``"first"``).
    ``capture_mode`` (MongoDB only): ``"change_streams"`` gives updates without ``after`` (see the fake).
    """
    if n_keys < 0 or n_changes < 0:
        raise ValueError("n_keys and n_changes must be >= 0")
    if partitions < 1:
        raise ValueError("partitions must be >= 1")
    state = ScenarioState(
        rng=Random(f"cdclake-fakes:{source}:{seed}"),  # noqa: S311 - reproducible fake data
        connector=make_connector(source, snapshot_style, capture_mode),
        partitions=partitions,
        table={},
        deleted=[],
        next_id=FIRST_KEY + n_keys,
        offsets={},
    )
    records: list[KafkaRecord] = []
    rows = [state.connector.new_row(state.rng, FIRST_KEY + i) for i in range(n_keys)]
    state.table = {FIRST_KEY + i: row for i, row in enumerate(rows)}
    if rows:
        _append(state, state.connector.snapshot(state.rng, rows), records)
    _stream(state, n_changes, records)
    return _result(source, state, records, 0)


def continue_stream(previous: FakeStream, n_changes: int) -> FakeStream:
    """``previous`` plus at least ``n_changes`` further changes at later positions (``previous`` is untouched)."""
    if previous.state is None:
        raise ValueError("this stream carries no scenario state to continue from")
    state = copy.deepcopy(previous.state)
    records = list(previous.records)
    _stream(state, n_changes, records)
    return _result(previous.source, state, records, len(previous.records))


def _result(source: str, state: ScenarioState, records: list[KafkaRecord], appended_from: int) -> FakeStream:
    conn = state.connector
    table = sorted(state.table.items())
    expected = {canonical_key(conn.key_payload(row)): conn.after_payload(row) for _, row in table}
    rows = {canonical_key(conn.key_payload(row)): dict(row) for _, row in table}
    return FakeStream(source, records, expected, conn.data_topic, conn.transaction_topic, appended_from, state, rows)


def _append(state: ScenarioState, emitted: list[Emitted], out: list[KafkaRecord]) -> None:
    for item in emitted:
        partition = partition_for(item.key, state.partitions)
        offset = state.offsets.get((item.topic, partition), 0)
        state.offsets[item.topic, partition] = offset + 1
        headers = list(item.headers) or None
        out.append(KafkaRecord(item.topic, partition, offset, item.key, item.value, item.timestamp_ms, headers))


def _stream(state: ScenarioState, n_changes: int, out: list[KafkaRecord]) -> None:
    pending = list(REQUIRED_KINDS) if n_changes > 0 else []
    done = 0
    while done < n_changes or pending:
        kind = pending.pop(0) if pending else _pick(state)
        statements = _plan(state, kind)
        done += sum(len(statement) for statement in statements)
        _append(state, state.connector.transaction(state.rng, statements), out)


def _pick(state: ScenarioState) -> str:
    weights = dict(_WEIGHTS)
    if len(state.table) < 4:
        weights["delete"] = weights["pk_change"] = 0.0
        weights["insert"] *= 3
    kinds = list(weights)
    return state.rng.choices(kinds, weights=[weights[k] for k in kinds])[0]


# --- planning: mutate the true table state, return the statements of one transaction -----------------------


def _fresh_id(state: ScenarioState, exclude: set[int], reuse: bool = True) -> int:
    """A key not in the table: sometimes a previously deleted one (re-insert), else a new one."""
    reusable = [k for k in state.deleted if k not in exclude and k not in state.table]
    if reuse and reusable and state.rng.random() < 0.25:
        key = state.rng.choice(reusable)
        state.deleted.remove(key)
        return key
    key = state.next_id
    state.next_id += 1
    return key


def _insert(state: ScenarioState, key: int) -> Statement:
    row = state.connector.new_row(state.rng, key)
    state.table[key] = row
    return (RowOp("c", None, row),)


def _update(state: ScenarioState, key: int) -> Statement:
    old = state.table[key]
    new = state.connector.changed_row(state.rng, old)
    state.table[key] = new
    return (RowOp("u", old, new),)


def _delete(state: ScenarioState, key: int) -> Statement:
    old = state.table.pop(key)
    state.deleted.append(key)
    return (RowOp("d", old, None),)


def _pk_change(state: ScenarioState, key: int) -> list[Statement]:
    """``UPDATE ... SET id = new``: delete(old key) + create(new key); one log record where the DB has PK updates."""
    old = state.table.pop(key)
    state.deleted.append(key)
    new_key = _fresh_id(state, {key}, reuse=False)
    new = state.connector.with_key(old, new_key)
    state.table[new_key] = new
    ops = (RowOp("d", old, None), RowOp("c", None, new))
    return [ops] if state.connector.pk_change_is_one_statement else [(ops[0],), (ops[1],)]


def _plan(state: ScenarioState, kind: str) -> list[Statement]:
    rng = state.rng
    existing = sorted(state.table)
    if not existing or (kind in ("delete", "pk_change") and len(existing) < 2):
        kind = "insert"
    if kind == "insert":
        return [_insert(state, _fresh_id(state, set()))]
    if kind == "update":
        return [_update(state, rng.choice(existing))]
    if kind == "delete":
        return [_delete(state, rng.choice(existing))]
    if kind == "pk_change":
        return _pk_change(state, rng.choice(existing))
    if kind == "same_key":
        return _same_key(state, existing)
    return _multi_row(state, existing)


def _same_key(state: ScenarioState, existing: list[int]) -> list[Statement]:
    """Several changes of one key in one transaction: u,u[,u|d] of an existing row or c,u,u of a new one."""
    rng = state.rng
    if rng.random() < 0.7:
        key = rng.choice(existing)
        statements = [_update(state, key), _update(state, key)]
        tail = rng.choice(("update", "delete", "none"))
        if tail == "update":
            statements.append(_update(state, key))
        elif tail == "delete":
            statements.append(_delete(state, key))
        return statements
    key = _fresh_id(state, set())
    return [_insert(state, key), _update(state, key), _update(state, key)]


def _multi_row(state: ScenarioState, existing: list[int]) -> list[Statement]:
    """Two to five rows (distinct keys) inserted, updated or deleted in one transaction."""
    rng = state.rng
    used: set[int] = set()
    statements: list[Statement] = []
    for _ in range(rng.randint(2, 5)):
        candidates = [k for k in existing if k not in used and k in state.table]
        roll = rng.random()
        if not candidates or roll < 0.35:
            key = _fresh_id(state, used)
            statements.append(_insert(state, key))
        elif roll < 0.85 or len(state.table) < 3:
            key = rng.choice(candidates)
            statements.append(_update(state, key))
        else:
            key = rng.choice(candidates)
            statements.append(_delete(state, key))
        used.add(key)
    return statements
