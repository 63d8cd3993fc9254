"""Ordering values: numeric, per connector, never string comparison (field notes §4.1, Hudi #9475)."""

from __future__ import annotations

import pytest

from ingest.debezium.ordering import MISSING, ordering
from ingest.errors import DecodeError


def test_db2_lsn_compares_segment_wise() -> None:
    older = ordering(
        {"connector": "db2", "commit_lsn": "00000027:00000758:0005", "change_lsn": "00000027:00000758:0003"}
    )
    newer = ordering(
        {"connector": "db2", "commit_lsn": "00000027:00000ac0:0007", "change_lsn": "00000027:00000ac0:0002"}
    )
    assert older == [0x27, 0x758, 5, 0x27, 0x758, 3]
    assert older < newer


def test_informix_lsns_compare_as_integers_not_strings() -> None:
    # As strings "99" > "100"; as positions 100 is later.
    a = ordering({"connector": "informix", "commit_lsn": "99", "change_lsn": "5"})
    b = ordering({"connector": "informix", "commit_lsn": "100", "change_lsn": "1"})
    assert a < b
    assert "99" > "100"  # the trap the ordering avoids


def test_oracle_commit_scn_then_scn() -> None:
    first = ordering({"connector": "oracle", "commit_scn": "2122185", "scn": "2122184"})
    second = ordering({"connector": "oracle", "commit_scn": "2122185", "scn": "2122190"})
    assert first < second
    snapshot = ordering({"connector": "oracle", "scn": "2122000"})
    assert snapshot == [2122000, 2122000, MISSING]  # a snapshot read shows what was committed up to its scn
    assert snapshot < first
    # A snapshot taken again later (to repair a table after a gap) is newer than the streamed changes before it:
    # with -1 for its missing commit_scn it lost to all of them, and the repair changed nothing in silver.
    again = ordering({"connector": "oracle", "scn": "5000000"})
    assert again > second
    # A transaction that began before the snapshot and committed after it is newer than the snapshot.
    straddling = ordering({"connector": "oracle", "commit_scn": "5000010", "scn": "4999000"})
    assert again < straddling


@pytest.mark.parametrize(
    "source",
    [
        {"connector": "oracle", "commit_scn": "2122185", "scn": "2122184"},
        {"connector": "mongodb", "ts_ms": 1558965508000, "ord": 1},
    ],
    ids=["oracle", "mongodb"],
)
def test_changes_sharing_a_position_in_one_transaction_keep_their_order(source: dict[str, object]) -> None:
    # A delete and re-insert of one document in one MongoDB transaction share its cluster time (as Oracle rows of
    # one transaction can share an scn): Debezium's transaction.total_order says which came first.
    delete = ordering(source, {"id": "tx1", "total_order": 1, "data_collection_order": 1})
    reinsert = ordering(source, {"id": "tx1", "total_order": 2, "data_collection_order": 2})
    assert delete < reinsert
    assert delete[:-1] == reinsert[:-1]
    # Without transaction metadata (or outside a transaction) the place is -1: the tie is silver's to break.
    assert ordering(source)[-1] == ordering(source, None)[-1] == MISSING
    assert ordering(source, {"id": "tx1", "total_order": "7"})[-1] == 7


def test_other_connectors_ignore_the_transaction_block() -> None:
    source = {"connector": "db2", "commit_lsn": "00000000:00000007:0000", "change_lsn": "00000000:00000005:0000"}
    assert ordering(source, {"id": "7", "total_order": 3}) == ordering(source) == [0, 7, 0, 0, 5, 0]


def test_informix_changes_sharing_a_clamped_change_lsn_keep_their_order() -> None:
    """Informix's connector raises the change_lsn of a transaction that began before the previous commit to a floor
    (Debezium's TxLogPosition): a delete and re-insert of one key in it tie on (commit_lsn, change_lsn), and the op
    tie-break ranked the delete last, dropping a row the source has. transaction.total_order orders them."""
    source = {"connector": "informix", "commit_lsn": "900", "change_lsn": "800"}
    delete = ordering(source, {"id": "12", "total_order": 1, "data_collection_order": 1})
    reinsert = ordering(source, {"id": "12", "total_order": 2, "data_collection_order": 2})
    assert delete == [900, 800, 1]
    assert delete < reinsert
    assert ordering(source) == [900, 800, MISSING]


def test_mongodb_seconds_then_ord() -> None:
    assert ordering({"connector": "mongodb", "ts_ms": 1558965508000, "ord": 2}) > ordering(
        {"connector": "mongodb", "ts_ms": 1558965508000, "ord": 1}
    )


def test_postgresql_sequence_pair() -> None:
    assert ordering({"connector": "postgresql", "sequence": '["22261816","22262048"]', "lsn": 22262048}) == [
        22261816,
        22262048,
    ]
    assert ordering({"connector": "postgresql", "lsn": 5}) == [MISSING, 5]


def test_postgresql_snapshot_reads_take_their_lsn_as_commit_position() -> None:
    """Snapshot reads and the first transaction streamed after a snapshot carry no last commit LSN (the recorded
    real stream: `[null,"22260056"]`); as -1 a snapshot taken again after streaming (snapshot.mode=when_needed
    after the slot was lost, or always) lost to every older streamed change, and silver kept the stale rows."""
    streamed = ordering({"connector": "postgresql", "sequence": '["22262544","22262600"]'})
    snapshot = ordering({"connector": "postgresql", "sequence": '[null,"30000000"]'})
    assert snapshot == [30000000, 30000000]
    first_after = ordering({"connector": "postgresql", "sequence": '[null,"30000100"]'})
    next_after = ordering({"connector": "postgresql", "sequence": '["30000150","30000200"]'})
    assert streamed < snapshot < first_after < next_after
    # The very first snapshot (nothing streamed before it) and its first transaction keep their order.
    assert ordering({"connector": "postgresql", "sequence": '[null,"22260056"]'}) < ordering(
        {"connector": "postgresql", "sequence": '[null,"22260096"]'}
    )


def test_mysql_binlog_file_number_is_numeric() -> None:
    a = ordering({"connector": "mysql", "file": "mysql-bin.000009", "pos": 900, "row": 0})
    b = ordering({"connector": "mysql", "file": "mysql-bin.000010", "pos": 4, "row": 0})
    assert a < b


def test_sqlserver_adds_event_serial_no() -> None:
    value = ordering(
        {"connector": "sqlserver", "commit_lsn": "00000025:00000d08:0025", "change_lsn": None, "event_serial_no": 2}
    )
    assert value == [0x25, 0xD08, 0x25, MISSING, MISSING, MISSING, 2]


@pytest.mark.parametrize(
    ("source", "message"),
    [
        ({"connector": "informix", "commit_lsn": "12a"}, "source.commit_lsn='12a' is not a valid informix position"),
        # str.isdigit() is true for both; int() refuses the first and reads the second as 12 (found by test_fuzz).
        ({"connector": "informix", "commit_lsn": "\u00b2"}, "commit_lsn=.\u00b2. is not a valid informix position"),
        ({"connector": "mongodb", "ts_ms": "\u0661\u0662"}, "is not a valid mongodb position"),
        ({"connector": "postgresql", "lsn": "\u0661\u0662"}, "not a valid postgresql LSN"),
        ({"connector": "mysql", "file": "mysql-bin.\u0661", "pos": 4}, "is not a binlog file name"),
        ({"connector": "db2", "commit_lsn": "zz:00:00"}, "not a valid db2 LSN"),
        ({"connector": "db2", "commit_lsn": "0001:0002"}, "not a valid db2 LSN"),
        ({"connector": "oracle", "scn": -4}, "negative"),
        ({"connector": "postgresql", "sequence": "[1,2"}, "not valid JSON"),
    ],
)
def test_malformed_positions_are_rejected_with_reason(source: dict[str, object], message: str) -> None:
    with pytest.raises(DecodeError, match=message.replace("(", r"\(").replace(")", r"\)")):
        ordering(source)


@pytest.mark.parametrize(
    ("transaction", "message"),
    [
        ({"id": "tx1", "total_order": -1}, "transaction.total_order=-1 is not a valid mongodb position (negative)"),
        ({"id": "tx1", "total_order": 1.5}, "transaction.total_order=1.5 is not a valid mongodb position"),
        ("tx1", "transaction='tx1' is not a transaction block"),
    ],
)
def test_malformed_transaction_places_are_rejected_with_reason(transaction: object, message: str) -> None:
    with pytest.raises(DecodeError, match=message.replace("(", r"\(").replace(")", r"\)")):
        ordering({"connector": "mongodb", "ts_ms": 1000, "ord": 1}, transaction)


def test_connector_inferred_when_source_omits_it() -> None:
    # The Oracle 1.5 docs' data events print no source.connector.
    assert ordering({"scn": "2122185", "commit_scn": "2122186", "txId": "6.28.807"}) == [2122186, 2122185, MISSING]
    assert ordering({"rs": "rs0", "ts_ms": 1000, "ord": 3}) == [1000, 3, MISSING]
    assert ordering({"db": "x"}, offset=7) == [7]  # nothing to infer from: ordered by Kafka offset, see below


def test_other_connectors_are_ordered_by_kafka_offset(caplog: pytest.LogCaptureFixture) -> None:
    """Any other Debezium connector (Vitess, Spanner, ...) lands: without a position cdclake knows, its changes take
    their Kafka offset as ordering value (Debezium's order within a partition), with one warning per connector.
    The MariaDB connector's binlog positions are MySQL's."""
    from ingest.debezium.envelope import RawRecord, decode

    with caplog.at_level("WARNING", logger="ingest.debezium.ordering"):
        assert ordering({"connector": "vitess", "vgtid": "[{...}]"}, offset=5) == [5]
        assert ordering({"connector": "vitess", "vgtid": "[{...}]"}, offset=6) == [6]
    assert caplog.text.count("connector 'vitess' (source.connector) has no source position") == 1
    value = b'{"op": "c", "after": {"id": 1}, "source": {"connector": "spanner", "commit_timestamp": "x"}}'
    assert decode(RawRecord("t", 0, 41, None, None, value)).ordering == [41]
    binlog = {"file": "mariadb-bin.000003", "pos": 154, "row": 1}
    assert ordering({"connector": "mariadb", **binlog}) == ordering({"connector": "mysql", **binlog}) == [3, 154, 1]


def test_positions_beyond_64_bits_are_rejected() -> None:
    with pytest.raises(DecodeError, match="beyond 64 bits"):
        ordering({"connector": "informix", "commit_lsn": "123456789012345678901", "change_lsn": "1"})


def test_db2_luw_lsns_of_sixteen_bytes_order_by_value() -> None:
    """Db2 LUW writes 16-byte LSNs (`00000000:000102b5:000000000007bf55`); the seed's examples have 10 bytes."""
    earlier = ordering({"connector": "db2", "commit_lsn": "00000000:000102b5:000000000007bf55", "change_lsn": None})
    later = ordering({"connector": "db2", "commit_lsn": "00000000:000102b5:00000000000800a0", "change_lsn": None})
    assert earlier == [0, 0x102B5, 0x7BF55, MISSING, MISSING, MISSING]
    assert earlier < later


def test_mongodb_oplog_mode_transactions_are_warned_about_without_a_transaction_block(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Oplog mode marks a multi-document transaction's changes with ``source.stxnid`` only (change-streams mode with
    ``lsid``/``txnNumber``): without transaction metadata they too can share a position, so they are warned about
    (once per connector), as change-streams ones are; a single-document change is not."""
    import ingest.debezium.ordering as ordering_module

    message = "connector mongodb: streamed changes carry no transaction block"
    base = {"connector": "mongodb", "ts_ms": 1558965508000, "ord": 6, "rs": "rs0"}
    monkeypatch.setattr(ordering_module, "_UNPLACED_CONNECTORS", set())
    with caplog.at_level("WARNING", logger="ingest.debezium.ordering"):
        ordering({**base, "stxnid": None, "txnNumber": None}, None)
    assert message not in caplog.text
    with caplog.at_level("WARNING", logger="ingest.debezium.ordering"):
        assert ordering({**base, "stxnid": "abc:1", "txnNumber": None}, None) == [1558965508000, 6, MISSING]
        ordering({**base, "stxnid": "abc:2", "txnNumber": None}, None)
    assert caplog.text.count(message) == 1


def test_db2_snapshot_reads_without_commit_lsn_take_their_change_lsn_as_commit_position() -> None:
    """A Db2 snapshot read with a change_lsn but no commit_lsn took -1 in the commit place: a snapshot taken again
    to repair a table lost to every older streamed change. It takes its change_lsn there (as PostgreSQL's and
    Oracle's reads take their own position); a read with neither stays all -1."""
    streamed = ordering(
        {"connector": "db2", "commit_lsn": "00000027:00000758:0005", "change_lsn": "00000027:00000758:0003"}
    )
    repair = ordering(
        {"connector": "db2", "snapshot": "true", "commit_lsn": None, "change_lsn": "00000030:00000001:0001"}
    )
    assert repair == [0x30, 1, 1, 0x30, 1, 1]
    assert streamed < repair
    last = ordering({"connector": "db2", "snapshot": "last", "change_lsn": "00000030:00000001:0002"})
    assert repair < last == [0x30, 1, 2, 0x30, 1, 2]
    assert ordering({"connector": "db2", "snapshot": "true", "commit_lsn": None, "change_lsn": None}) == [MISSING] * 6
    # A read with its snapshot LSN as commit_lsn keeps it.
    assert ordering({"connector": "db2", "snapshot": "first", "commit_lsn": "00000030:00000001:0001"}) == [
        0x30,
        1,
        1,
        MISSING,
        MISSING,
        MISSING,
    ]
