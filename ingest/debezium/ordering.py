"""Per-connector ordering: which change of a key is later, as a list of integers compared lexicographically.

Positions are parsed to integers, never compared as strings (Hudi lost updates comparing MySQL binlog positions as
strings, apache/hudi#9475). Every connector yields a fixed number of components, so the lists of one table compare
component by component; a position the event does not carry (snapshot reads often have no commit LSN) is -1, i.e.
older than any real position. The full order of bronze rows is (ordering, op rank, Kafka offset); see silver.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Mapping
from typing import Any

import orjson

from ingest.errors import DecodeError

log = logging.getLogger(__name__)
Position = list[int]
MISSING = -1
MAX_POSITION = 2**63 - 1  # positions are stored as Iceberg longs
_HEX_SEGMENTS = re.compile(r"^[0-9A-Fa-f]+(:[0-9A-Fa-f]+)*$")
_LSN_SEGMENTS = 3  # Db2 / SQL Server LSNs: XXXXXXXX:XXXXXXXX:XXXX (Db2 LUW: 16 hex digits in the last)
_PG_LSN = re.compile(r"^([0-9A-Fa-f]+)/([0-9A-Fa-f]+)$")
_BINLOG_FILE = re.compile(r"([0-9]+)$")  # ASCII digits: \d would take any script's


def _ascii_digits(value: str) -> bool:
    """Only 0-9: ``str.isdigit`` also takes '²' (which int() refuses) and other scripts' digits (which it takes)."""
    return value.isascii() and value.isdigit()


def _decimal(digits: str) -> int:
    """int() of ASCII digits; beyond 19 significant digits a position no long holds (and int() of more than 4,300
    digits raises ValueError, which would stop the ingester on this record at every restart): MAX_POSITION + 1."""
    return int(digits) if len(digits.lstrip("0")) <= 19 else MAX_POSITION + 1


def _integer(source: Mapping[str, Any], field: str, connector: str, block: str = "source") -> int:
    value = source.get(field)
    if value is None:
        return MISSING
    if isinstance(value, str) and _ascii_digits(value):
        value = _decimal(value)
    if type(value) is int:
        if value < 0:
            raise DecodeError(f"{block}.{field}={value!r} is not a valid {connector} position (negative)")
        if value > MAX_POSITION:
            raise DecodeError(f"{block}.{field}={value!r} is not a valid {connector} position (beyond 64 bits)")
        return value
    raise DecodeError(f"{block}.{field}={value!r} is not a valid {connector} position (expected an integer)")


def _hex_lsn(source: Mapping[str, Any], field: str, connector: str) -> list[int]:
    value = source.get(field)
    if value is None:
        return [MISSING] * _LSN_SEGMENTS
    if not isinstance(value, str) or not _HEX_SEGMENTS.match(value) or value.count(":") != _LSN_SEGMENTS - 1:
        raise DecodeError(
            f"source.{field}={value!r} is not a valid {connector} LSN (expected three colon-separated hex segments)"
        )
    parts = [int(part, 16) for part in value.split(":")]
    if max(parts) > MAX_POSITION:
        raise DecodeError(f"source.{field}={value!r} is not a valid {connector} LSN (a segment beyond 64 bits)")
    return parts


def _db2(source: Mapping[str, Any]) -> Position:
    # A snapshot read usually carries the snapshot LSN as commit_lsn. One with a change_lsn but no commit_lsn takes
    # that change_lsn in the commit place (as PostgreSQL's and Oracle's snapshot reads take their own position): as
    # -1, a snapshot taken again to repair a table would lose to every older streamed change. With neither: -1.
    commit, change = _hex_lsn(source, "commit_lsn", "db2"), _hex_lsn(source, "change_lsn", "db2")
    return (change if source.get("commit_lsn") is None else commit) + change


def _sqlserver(source: Mapping[str, Any]) -> Position:
    return (
        _hex_lsn(source, "commit_lsn", "sqlserver")
        + _hex_lsn(source, "change_lsn", "sqlserver")
        + [_integer(source, "event_serial_no", "sqlserver")]
    )


def _informix(source: Mapping[str, Any]) -> Position:
    # Emitted as optional decimal strings of differing length: compare as integers.
    return [_integer(source, "commit_lsn", "informix"), _integer(source, "change_lsn", "informix")]


def _oracle(source: Mapping[str, Any]) -> Position:
    # commit_scn exists only with LogMiner; scn orders the changes inside a transaction. A snapshot read has no
    # commit_scn: it shows every transaction committed up to its scn, so that scn is its commit position too (as -1,
    # a snapshot taken again to repair a table would lose to every older streamed change).
    scn = _integer(source, "scn", "oracle")
    commit_scn = _integer(source, "commit_scn", "oracle")
    return [scn if commit_scn == MISSING else commit_scn, scn]


def _mongodb(source: Mapping[str, Any]) -> Position:
    # ts_ms is the cluster time's seconds * 1000; ord orders operations within that second.
    return [_integer(source, "ts_ms", "mongodb"), _integer(source, "ord", "mongodb")]


def _pg_lsn(value: Any, field: str) -> int:
    if value is None or value == "null":
        return MISSING
    lsn: int | None = None
    if type(value) is int:
        lsn = value
    elif isinstance(value, str):
        if _ascii_digits(value):
            lsn = _decimal(value)
        elif match := _PG_LSN.match(value):
            lsn = (int(match.group(1), 16) << 32) + int(match.group(2), 16)
    if lsn is None:
        raise DecodeError(f"source.{field}={value!r} is not a valid postgresql LSN")
    if not 0 <= lsn <= MAX_POSITION:
        # A dead letter here: past the decoder, the bronze commit itself would fail on it, on every restart.
        raise DecodeError(f"source.{field}={value!r} is not a valid postgresql LSN (beyond a 63-bit position)")
    return lsn


def _postgresql(source: Mapping[str, Any]) -> Position:
    # source.sequence = '["<last commit LSN>","<LSN>"]': the LSN alone misorders interleaved transactions. Snapshot
    # reads, and the first transaction streamed after a snapshot, have no last commit LSN: their LSN takes its
    # place (as an Oracle snapshot read's scn does), or a snapshot taken again to repair a table, and the changes
    # streamed right after it, would lose to every older streamed change.
    sequence = source.get("sequence")
    if sequence is not None:
        try:
            parts = orjson.loads(sequence) if isinstance(sequence, str) else sequence
        except orjson.JSONDecodeError:
            raise DecodeError(f"source.sequence={sequence!r} is not valid JSON") from None
        if not isinstance(parts, list) or len(parts) != 2:
            raise DecodeError(f"source.sequence={sequence!r} is not a [commit LSN, LSN] pair")
        commit, lsn = _pg_lsn(parts[0], "sequence[0]"), _pg_lsn(parts[1], "sequence[1]")
        return [lsn if commit == MISSING else commit, lsn]
    return [MISSING, _pg_lsn(source.get("lsn"), "lsn")]


def _mysql(source: Mapping[str, Any]) -> Position:
    file = source.get("file")
    if file is None:
        file_number = MISSING
    else:
        match = _BINLOG_FILE.search(str(file))
        if not match:
            raise DecodeError(f"source.file={file!r} is not a binlog file name (expected a numeric suffix)")
        file_number = _decimal(match.group(1))
        if file_number > MAX_POSITION:
            raise DecodeError(f"source.file={str(file)[:80]!r}: a binlog file number beyond 64 bits")
    return [file_number, _integer(source, "pos", "mysql"), _integer(source, "row", "mysql")]


ORDERINGS: dict[str, Callable[[Mapping[str, Any]], Position]] = {
    "db2": _db2,
    "informix": _informix,
    "oracle": _oracle,
    "mongodb": _mongodb,
    "postgresql": _postgresql,
    "mysql": _mysql,
    "mariadb": _mysql,  # Debezium's MariaDB connector (2.5+) shares the MySQL binlog's source fields
    "sqlserver": _sqlserver,
}
_UNKNOWN_CONNECTORS: set[str] = set()  # warned about once each

# Changes of one transaction can share these connectors' positions: a MongoDB transaction's events share its
# cluster time (ts_ms, ord), Oracle rows of one transaction can share an scn, and Informix's connector (2.x) raises
# the change_lsn of a transaction that began before the previous commit to a floor, so its early changes share one
# value. Their ordering ends with the event's place in its transaction (Debezium's ``transaction.total_order``,
# with provide.transaction.metadata; -1 without), so a delete and re-insert of one key in one transaction keep
# their order instead of falling to the op tie-break.
TRANSACTION_ORDERED = frozenset({"oracle", "mongodb", "informix"})

_UNPLACED_CONNECTORS: set[str] = set()  # warned about once each (note_unplaced_change)


def note_unplaced_change(connector: str) -> None:
    """Warn, once per connector, that a streamed change of a connector in TRANSACTION_ORDERED came without its
    place in its transaction: with provide.transaction.metadata off, ties inside a transaction fall to the op."""
    if connector in _UNPLACED_CONNECTORS:
        return
    _UNPLACED_CONNECTORS.add(connector)
    log.warning(
        "connector %s: streamed changes carry no transaction block (the connector's provide.transaction.metadata "
        "is off): changes of one transaction can share a position, and silver then orders them by op "
        "(r < c < u < d), so a delete and re-insert of one key in one transaction leaves the key deleted; set "
        "provide.transaction.metadata=true on the connector",
        connector,
    )


def in_transaction(connector: str, source: Mapping[str, Any]) -> bool:
    """Whether the change belongs to a transaction, so that provide.transaction.metadata gives it a transaction
    block: every streamed change of Oracle and Informix (snapshot reads have none, with the metadata or without;
    ``source.snapshot`` is text, or a boolean on early connectors); for MongoDB, one of a multi-document
    transaction: ``source.lsid``/``txnNumber`` in change-streams mode, ``source.stxnid`` (``"<lsid>:<txnNumber>"``)
    in oplog mode (a single-document change has none of them, and no block either way)."""
    if connector == "mongodb":
        return source.get("txnNumber") is not None or source.get("stxnid") is not None
    snapshot = source.get("snapshot")
    return snapshot is None or snapshot is False or snapshot == "false"


def _infer_connector(source: Mapping[str, Any]) -> str | None:
    """Older connectors (Oracle 1.x docs) omit ``source.connector``; the position fields still tell them apart."""
    if "scn" in source:
        return "oracle"
    if "ord" in source and "rs" in source:
        return "mongodb"
    if "change_lsn" in source or "commit_lsn" in source:
        lsn = source.get("commit_lsn") or source.get("change_lsn")
        if isinstance(lsn, str) and ":" in lsn:
            return "sqlserver" if "event_serial_no" in source else "db2"
        return "informix"
    if "file" in source and "pos" in source:
        return "mysql"
    if "lsn" in source or "sequence" in source:
        return "postgresql"
    return None


def total_order(transaction: Any, connector: str) -> int:
    """The event's place in its transaction (``transaction.total_order``), -1 outside one."""
    if transaction is None:
        return MISSING
    if not isinstance(transaction, Mapping):
        raise DecodeError(f"transaction={transaction!r} is not a transaction block (expected an object or null)")
    return _integer(transaction, "total_order", connector, block="transaction")


def ordering(source: Any, transaction: Any = None, offset: int = MISSING) -> Position:
    """The ordering value of one change event, from its ``source`` block (and ``transaction``, see above).

    ``[offset]`` (the record's Kafka offset) for a connector whose position cdclake does not know (any other
    Debezium connector: Vitess, Spanner, ...): Debezium's own order within a partition, which the changes of one
    Kafka key share, as Debezium's JDBC sink relies on (docs/architecture.md says where it falls short)."""
    if not isinstance(source, Mapping):
        raise DecodeError("the envelope has no source block")
    connector = source["connector"] if "connector" in source else _infer_connector(source)
    compute = ORDERINGS.get(connector) if isinstance(connector, str) else None
    if compute is None:
        if repr(connector) not in _UNKNOWN_CONNECTORS:
            _UNKNOWN_CONNECTORS.add(repr(connector))
            log.warning(
                "connector %r (source.connector) has no source position cdclake knows (it knows %s): its changes "
                "are ordered by Kafka offset, which holds within a partition",
                connector,
                ", ".join(sorted(ORDERINGS)),
            )
        return [offset]
    if connector in TRANSACTION_ORDERED:
        place = total_order(transaction, connector)
        if place == MISSING and transaction is None and in_transaction(connector, source):
            note_unplaced_change(connector)
        return [*compute(source), place]
    return compute(source)
