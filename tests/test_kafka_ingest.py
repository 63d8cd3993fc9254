"""Bronze from a real Kafka-protocol broker (embedded Tansu): exactly once, resumable, configurable."""

from __future__ import annotations

import datetime as dt
import logging
import re
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import orjson
import pytest
from confluent_kafka import Consumer, Producer

from ingest.broker import Record, TansuBroker
from ingest.cli import main as cli_main
from ingest.errors import ConfigError
from ingest.fakes import build_stream, continue_stream
from ingest.sources.kafka import ClusterUnreachableError, OffsetOutOfRangeError
from ingest.testing.kafka_mock import CONSUMER_SETTINGS as MOCK_CONSUMER_SETTINGS
from ingest.testing.kafka_mock import MockKafkaCluster
from tests.conftest import FIXTURES, ingest_file, make_settings
from tests.kafka_fixtures import (
    COORDINATES,
    ONE_RECORD_BATCHES,
    broker,  # noqa: F401 - the session fixture
    bronze_coordinates,
    bronze_rows,
    kafka_settings,
    lost_and_duplicated,
    publish,
    retopic,
    run_kafka,
    unique,
)
from tests.processes import wait_until

pytestmark = pytest.mark.kafka
PG_DUMP = FIXTURES / "debezium" / "postgres" / "dbserver1.jsonl"
PARTITIONS = 3


def test_fake_streams_land_exactly_once_and_resume(broker: TansuBroker, lakehouse: Path) -> None:  # noqa: F811
    prefix = unique("a") + "."
    streams = [build_stream(s, seed=1, n_keys=30, n_changes=150, partitions=PARTITIONS) for s in ("db2", "oracle")]
    records = [r for stream in streams for r in retopic(stream.records, prefix)]
    topics = sorted({r.topic for r in records})
    assert len(topics) == 4
    expected = publish(broker, records, PARTITIONS)
    assert expected == {(prefix + r.topic, r.partition, r.offset) for stream in streams for r in stream.records}
    assert len({(t, p) for t, p, _ in expected}) == 4 * PARTITIONS  # every partition holds records

    settings = kafka_settings(lakehouse, broker, topics=topics, max_records=200)  # several flushes
    first = run_kafka(settings)
    assert first.stats.flushes > 1
    assert first.stats.dead_letters == 0
    assert first.stats.written == len(records)
    counts = bronze_coordinates(settings)
    assert set(counts) == expected
    assert set(counts.values()) == {1}

    # Tombstones are kept: exactly the records without a value are rows without an op.
    tombstones = {(prefix + r.topic, r.partition, r.offset) for st in streams for r in st.records if r.value is None}
    assert tombstones
    data_rows = [row for rows in bronze_rows(settings, [*COORDINATES, "op"]).values() for row in rows if "op" in row]
    without_op = {(r["_cdc_topic"], r["_cdc_partition"], r["_cdc_offset"]) for r in data_rows if r["op"] is None}
    assert without_op == tombstones

    # A restart finds everything in bronze.
    again = run_kafka(settings)
    assert again.stats.written == 0
    assert bronze_coordinates(settings) == counts

    # New changes: only they are written.
    more = [continue_stream(stream, 60) for stream in streams]
    new_records = [r for stream in more for r in retopic(stream.new_records, prefix)]
    new = publish(broker, new_records, PARTITIONS)
    assert new == {(prefix + r.topic, r.partition, r.offset) for stream in more for r in stream.new_records}
    third = run_kafka(settings)
    assert third.stats.written == len(new_records)
    counts = bronze_coordinates(settings)
    assert set(counts) == expected | new
    assert set(counts.values()) == {1}


def test_compressed_topics_land_exactly_once(broker: TansuBroker, lakehouse: Path) -> None:  # noqa: F811
    """Kafka Connect compresses Debezium's batches when told to (``producer.override.compression.type``): topics
    produced with every codec Kafka has land the same bronze as an uncompressed topic."""
    stream = build_stream("db2", seed=3, n_keys=20, n_changes=80, partitions=PARTITIONS)
    codecs = ["none", "lz4", "zstd", "gzip", "snappy"]
    expected: dict[str, set[tuple[str, int, int]]] = {}
    prefixes = {codec: f"{unique('z')}.{codec}." for codec in codecs}
    for codec, prefix in prefixes.items():
        records = retopic(stream.records, prefix)
        expected[codec] = publish(broker, records, PARTITIONS, producer={"compression.type": codec})
    topics = sorted({topic for coordinates in expected.values() for topic, _, _ in coordinates})
    settings = kafka_settings(lakehouse, broker, topics=topics)
    pipeline = run_kafka(settings)
    assert pipeline.stats.dead_letters == 0
    assert pipeline.stats.written == len(codecs) * len(stream.records)
    counts = bronze_coordinates(settings)
    assert set(counts) == set().union(*expected.values())
    assert set(counts.values()) == {1}
    rows = bronze_rows(settings, [*COORDINATES, "op", "after"])
    by_codec: dict[str, list[tuple[Any, ...]]] = {codec: [] for codec in codecs}
    for table in rows.values():
        for row in table:
            codec = row["_cdc_topic"].split(".")[1]
            by_codec[codec].append(
                (row["_cdc_partition"], row["_cdc_offset"], repr(row.get("op")), repr(row.get("after")))
            )
    plain = sorted(by_codec["none"])
    assert len(plain) == len(stream.records)
    for codec in codecs[1:]:
        assert sorted(by_codec[codec]) == plain, codec
    # The batches really were compressed: reading the change topic took far fewer bytes from the broker than
    # reading the uncompressed one, which took more than its messages hold.
    wire = {codec: fetched_bytes(broker, prefix + stream.data_topic) for codec, prefix in prefixes.items()}
    assert wire["none"][0] > wire["none"][1]
    assert {codec: received < 0.75 * wire["none"][0] for codec, (received, _) in wire.items() if codec != "none"} == {
        codec: True for codec in codecs[1:]
    }, wire


def fetched_bytes(broker: TansuBroker, topic: str) -> tuple[int, int]:  # noqa: F811
    """Read ``topic`` to its end; librdkafka's counts of the bytes received from the brokers and of the messages'
    bytes in them (decompressed)."""
    from confluent_kafka import OFFSET_BEGINNING, KafkaError, TopicPartition

    stats: list[str] = []
    consumer = Consumer(
        {
            "bootstrap.servers": broker.bootstrap_servers,
            "group.id": unique("stats"),
            "enable.partition.eof": True,
            "statistics.interval.ms": 100,
            "fetch.wait.max.ms": 10,
            "stats_cb": stats.append,
        }
    )
    try:
        consumer.assign([TopicPartition(topic, partition, OFFSET_BEGINNING) for partition in range(PARTITIONS)])
        at_end: set[int | None] = set()
        deadline = time.monotonic() + 30
        while len(at_end) < PARTITIONS and time.monotonic() < deadline:
            for message in consumer.consume(1000, 0.1):
                error = message.error()
                if error is not None and error.code() == KafkaError._PARTITION_EOF:
                    at_end.add(message.partition())
        assert len(at_end) == PARTITIONS, f"{topic} not read to its end"
        read = len(stats)
        while len(stats) == read and time.monotonic() < deadline:  # statistics taken after the last fetch
            consumer.poll(0.1)
    finally:
        consumer.close()
    last = orjson.loads(stats[-1])
    return sum(broker_stats["rxbytes"] for broker_stats in last["brokers"].values()), last["rxmsg_bytes"]


def test_topic_pattern_follows_matching_topics(broker: TansuBroker, lakehouse: Path) -> None:  # noqa: F811
    prefix = unique("c")
    stream = build_stream("informix", seed=2, n_keys=10, n_changes=30, partitions=2)
    changes = [r for r in stream.records if r.topic == stream.data_topic]
    wanted = [Record(f"{prefix}.orders", r.key, r.value, r.partition) for r in changes]
    also = [Record(f"{prefix}.customers", r.key, r.value, r.partition) for r in changes[:25]]
    other = [Record(f"{prefix}x.orders", r.key, r.value, r.partition) for r in changes[:5]]
    expected = publish(broker, wanted + also, 2)
    publish(broker, other, 2)

    settings = kafka_settings(lakehouse, broker, topic_pattern=rf"{re.escape(prefix)}\.(orders|customers)")
    pipeline = run_kafka(settings)
    assert pipeline.stats.written == len(wanted) + len(also)
    counts = bronze_coordinates(settings)
    assert set(counts) == expected
    assert set(counts.values()) == {1}
    assert {t for t, _, _ in counts} == {f"{prefix}.orders", f"{prefix}.customers"}


def test_consumer_settings_pass_through(
    broker: TansuBroker,  # noqa: F811
    lakehouse: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    topic = unique("d") + ".t"
    stream = build_stream("db2", seed=3, n_keys=5, n_changes=5)
    changes = [r for r in stream.records if r.topic == stream.data_topic]
    publish(broker, [Record(topic, r.key, r.value, r.partition) for r in changes], 1)
    seen: list[dict[str, Any]] = []
    real_consumer = Consumer

    def recording_consumer(config: dict[str, Any], **kwargs: Any) -> Any:
        seen.append(dict(config))
        return real_consumer(config, **kwargs)

    monkeypatch.setattr("ingest.sources.kafka.Consumer", recording_consumer)
    client_id = unique("cdclake-client-")
    consumer = {"client.id": client_id, "fetch.wait.max.ms": "50", "session.timeout.ms": "2001"}
    settings = kafka_settings(lakehouse, broker, topics=[topic], consumer=consumer)
    assert run_kafka(settings).stats.written == len(changes)
    assert len(seen) == 1
    # Unchanged, and the user's value wins over cdclake's default.
    assert {key: seen[0][key] for key in consumer} == consumer
    assert seen[0]["bootstrap.servers"] == broker.bootstrap_servers

    # A setting librdkafka does not know, or a value it rejects: a configuration error naming the key.
    bad = kafka_settings(lakehouse / "bad", broker, topics=[topic], consumer={"no.such.setting": "1"})
    with pytest.raises(ConfigError, match=r"source\.consumer: .*No such configuration property: \"no\.such\.setting\""):
        run_kafka(bad)
    bad = kafka_settings(lakehouse / "bad", broker, topics=[topic], consumer={"fetch.wait.max.ms": "sideways"})
    with pytest.raises(ConfigError, match=r"source\.consumer: .*Invalid value .*\"fetch\.wait\.max\.ms\""):
        run_kafka(bad)
    # ... which the command line reports as one line, not a traceback.
    root = logging.getLogger()
    monkeypatch.setattr(root, "handlers", list(root.handlers))  # `cdclake` configures logging globally
    monkeypatch.setattr(root, "level", root.level)
    monkeypatch.setattr(
        sys, "argv", ["cdclake", "--config", str(lakehouse / "bad" / "cdclake.yml"), "ingest", "--once"]
    )
    with pytest.raises(SystemExit) as exited:
        cli_main()
    assert exited.value.code == 2
    assert re.search(r"error: source\.consumer: .*fetch\.wait\.max\.ms", capsys.readouterr().err)


def test_real_postgres_stream_matches_the_file_source(
    broker: TansuBroker,  # noqa: F811
    lakehouse: Path,
    tmp_path: Path,
) -> None:
    prefix = unique("e") + "."
    lines = [orjson.loads(line) for line in PG_DUMP.read_bytes().splitlines() if line.strip()]
    for item in lines:
        item["topic"] = prefix + item["topic"]
    assert sum("headers" in item for item in lines) > 10  # Debezium's, recorded in kcat's form
    dump = tmp_path / "renamed.jsonl"
    dump.write_bytes(b"".join(orjson.dumps(item) + b"\n" for item in lines))

    records = [
        Record(
            item["topic"],
            None if item["key"] is None else item["key"].encode(),
            None if item["payload"] is None else item["payload"].encode(),
            partition=item["partition"],
            timestamp_ms=item["ts"],
            headers=_kcat_headers(item.get("headers")),
        )
        for item in lines
    ]
    delivered = publish(broker, records, 1)
    assert delivered == {(item["topic"], item["partition"], item["offset"]) for item in lines}

    via_kafka = kafka_settings(lakehouse / "kafka", broker, topics=sorted({r.topic for r in records}), max_records=7)
    run_kafka(via_kafka)

    via_file = make_settings(lakehouse / "file")
    ingest_file(via_file, dump)

    def contents(settings: Any) -> dict[str, list[dict[str, Any]]]:
        tables = bronze_rows(settings)
        for rows in tables.values():
            for row in rows:
                row.pop("_cdc_ingested_at")
            rows.sort(key=lambda r: (r["_cdc_topic"], r["_cdc_partition"], r["_cdc_offset"]))
        return tables

    kafka_tables, file_tables = contents(via_kafka), contents(via_file)
    assert sorted(kafka_tables) == sorted(file_tables)
    landed = {
        (row["_cdc_topic"], row["_cdc_offset"]): row["_cdc_headers"] for rows in kafka_tables.values() for row in rows
    }
    assert landed == {
        (item["topic"], item["offset"]): None
        if "headers" not in item
        else [{"key": key, "value": value} for key, value in _kcat_headers(item["headers"]) or []]
        for item in lines
    }
    assert "_cdc_dead_letters" in kafka_tables  # the oversized numeric, as with the file source
    for name in file_tables:
        assert kafka_tables[name] == file_tables[name], name


def _kcat_headers(flat: list[str | None] | None) -> list[tuple[str, bytes | None]] | None:
    if flat is None:
        return None
    return [
        (str(name), None if value is None else value.encode())
        for name, value in zip(flat[::2], flat[1::2], strict=True)
    ]


def test_cooperative_rebalancing_hands_over_only_the_moved_partitions(
    broker: TansuBroker,  # noqa: F811
    lakehouse: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """`partition.assignment.strategy: cooperative-sticky`: a second member joining the group mid-stream takes over
    some partitions (incremental revoke and assign) while the first keeps the others without a revoke. The first
    commits what it had buffered before its partitions move, the second resumes them at bronze's offsets, and each
    lands its share of the later records: every record once, none lost."""
    from ingest.cli.ingest_cmd import build_pipeline
    from ingest.sources.kafka import KafkaSource

    prefix = unique("coop")
    stream = build_stream("oracle", seed=5, n_keys=8, n_changes=20, partitions=PARTITIONS)
    first = publish(broker, retopic(stream.records, prefix), PARTITIONS)
    topics = sorted({t for t, _, _ in first})
    every = {(t, p) for t in topics for p in range(PARTITIONS)}
    assert {c[:2] for c in first} == every  # every partition holds records
    # Nothing commits by size or age before the members stop: what lands before that, a revoke committed. Sessions of
    # 6 s (cdclake's default), not the tests' 2: one expiring on a loaded machine would rebalance the group again.
    # (Both rounds of the cooperative rebalance then take ~10 s on Tansu: with 2 s sessions, ~4 s.)
    settings = kafka_settings(
        lakehouse,
        broker,
        topics=topics,
        consumer={"partition.assignment.strategy": "cooperative-sticky", "session.timeout.ms": "6000"},
        latency_threshold_s=600,
    )
    members = [build_pipeline(settings), build_pipeline(settings)]
    sources = [member.source for member in members]
    assert isinstance(sources[0], KafkaSource)
    assert isinstance(sources[1], KafkaSource)
    first_source, second_source = sources[0], sources[1]
    revoked: list[list[tuple[str, int]]] = []  # the first member's revokes, each as the callback got it
    commit_on_revoke = first_source.on_revoke
    assert commit_on_revoke is not None

    def recording_revoke(partitions: list[tuple[str, int]]) -> None:
        revoked.append(sorted(partitions))
        commit_on_revoke(partitions)

    first_source.on_revoke = recording_revoke
    runners = [threading.Thread(target=member.run, daemon=True) for member in members]
    try:
        with caplog.at_level(logging.INFO, logger="ingest.sources.kafka"):
            runners[0].start()
            wait_until(lambda: members[0].stats.records_in == len(first), 30, "the first member to read every record")
            assert first_source.assignment == every
            assert members[0].stats.written == 0  # all buffered

            runners[1].start()

            def split() -> bool:
                mine, theirs = first_source.assignment, second_source.assignment
                return bool(mine) and bool(theirs) and mine | theirs == every and not mine & theirs

            wait_until(split, 45, "the group to split the partitions between the two members")
            kept, moved = first_source.assignment, second_source.assignment
            assert revoked == [sorted(moved)], "the first member was revoked other partitions than the moved ones"
            assert members[0].stats.written == len(first)  # committed on the revoke, before the handover

            more = continue_stream(stream, 40)
            second = publish(broker, retopic(more.new_records, prefix), PARTITIONS)
            assert {c[:2] for c in second} == every
            wait_until(
                lambda: members[0].stats.records_in + members[1].stats.records_in == len(first) + len(second),
                30,
                "the members to read the later records",
            )
            assignments = [r.getMessage() for r in caplog.records if r.getMessage().startswith("assigned ")]
            revokes_before_stop = list(revoked)
    finally:
        for member in members:
            member.stop_requested.set()
        for runner in runners:
            if runner.ident is not None:  # started
                runner.join(30)
    assert not any(runner.is_alive() for runner in runners), "a member did not stop"

    # No stop-the-world rebalance: the kept partitions were assigned once (at the start, to the first member), the
    # moved ones again to the second, at the offset after the records the first committed on its revoke.
    resumed_at = {tp: 1 + max(o for t, p, o in first if (t, p) == tp) for tp in moved}
    assert sorted(assignments) == sorted(
        [f"assigned {t}[{p}] from offset beginning" for t, p in every]
        + [f"assigned {t}[{p}] from offset {resumed_at[t, p]}" for t, p in moved]
    )
    assert revokes_before_stop == [sorted(moved)]
    # Each member read and landed its own share of the later records, the second nothing of the earlier ones.
    assert members[1].stats.records_in == members[1].stats.written == len({c for c in second if c[:2] in moved})
    assert members[0].stats.written == len(first) + len({c for c in second if c[:2] in kept})
    counts = bronze_coordinates(settings)
    assert lost_and_duplicated(first | second, counts) == (set(), set())
    assert set(counts) == first | second


def test_a_topic_created_after_start_is_waited_for(
    broker: TansuBroker,  # noqa: F811
    lakehouse: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Debezium creates topics lazily: the service must not die because its topic does not exist yet. It says
    which topic it waits for, and names the cluster's topics closest to it (a mistyped name waits for ever)."""

    from ingest.cli.ingest_cmd import build_pipeline

    prefix = unique("late")
    stream = build_stream("db2", seed=6, n_keys=5, n_changes=10, partitions=1)
    records = [r for r in retopic(stream.records, prefix) if r.topic.endswith("CUSTOMERS")]
    topic = records[0].topic
    broker.create_topics([topic[:-1]], partitions=1)  # the name the suggestion finds
    settings = kafka_settings(lakehouse, broker, topics=[topic], latency_threshold_s=1.0)
    pipeline = build_pipeline(settings)
    runner = threading.Thread(target=pipeline.run, daemon=True)
    with caplog.at_level(logging.WARNING, logger="ingest.sources.kafka"):
        runner.start()
        deadline = time.monotonic() + 30  # the warning comes with the first metadata answer (~1 s; slower in CI)
        while runner.is_alive() and time.monotonic() < deadline:
            if any("does not exist" in r.getMessage() for r in caplog.records):
                break
            time.sleep(0.1)
        time.sleep(1.0)  # and no second one
    try:
        assert runner.is_alive(), "the ingester died because its topic did not exist yet"
        missing = [r.getMessage() for r in caplog.records if "does not exist" in r.getMessage()]
        assert len(missing) == 1, missing
        # The closest first (the shared broker holds other tests' topics, some of them close too).
        assert missing[0].startswith(
            f"kafka: subscribed topic {topic!r} does not exist (yet: Debezium creates a table's topic with its first "
            f"change); did you mean {topic[:-1]!r}"
        ), missing
        expected = publish(broker, records, 1)
        deadline = time.monotonic() + 40
        while time.monotonic() < deadline and pipeline.stats.written < len(expected):
            time.sleep(0.5)
    finally:
        pipeline.stop_requested.set()
        runner.join(30)
    assert not runner.is_alive(), "the ingester did not stop"
    assert set(bronze_coordinates(settings)) == expected


# A member of the group in a process of its own, which the test can SIGKILL: it reports its assignments.
GROUP_MEMBER = """
import sys
from confluent_kafka import Consumer, Producer
consumer = Consumer({"bootstrap.servers": sys.argv[1], "group.id": sys.argv[2], "enable.auto.commit": False,
                     "session.timeout.ms": 2000, "heartbeat.interval.ms": 500})
consumer.subscribe(sys.argv[3].split(","), on_assign=lambda c, ps: print("assigned", len(ps), flush=True))
while True:
    consumer.poll(0.1)
"""


# A member whose session timeout (and poll interval, the rebalance timeout) is argv[4] ms, in its own process.
SLOW_SESSION_MEMBER = GROUP_MEMBER.replace(
    '"session.timeout.ms": 2000', '"session.timeout.ms": int(sys.argv[4]), "max.poll.interval.ms": int(sys.argv[4])'
)


class OnceBesideAMember:
    """Records on 2 topics x 3 partitions; a group member (its own process) holding all of them; then an
    in-process `--once` run joining the group, on a thread, once the group has split the partitions.
    ``member_session_ms``: the member's session timeout (default 2 s, as the `--once` run's)."""

    def __init__(self, broker: TansuBroker, lakehouse: Path, name: str, member_session_ms: int | None = None) -> None:  # noqa: F811
        from ingest.cli.ingest_cmd import build_pipeline
        from ingest.sources.kafka import KafkaSource

        stream = build_stream("db2", seed=8, n_keys=20, n_changes=120, partitions=PARTITIONS)
        self.expected = publish(broker, retopic(stream.records, unique(name)), PARTITIONS)
        topics = sorted({t for t, _, _ in self.expected})
        self.settings = kafka_settings(lakehouse, broker, topics=topics)
        assert self.settings.source is not None
        group = self.settings.source.group_id
        member = [GROUP_MEMBER] if member_session_ms is None else [SLOW_SESSION_MEMBER, str(member_session_ms)]
        self.member = subprocess.Popen(
            [sys.executable, "-c", member[0], broker.bootstrap_servers, group, ",".join(topics), *member[1:]],
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.member.stdout is not None
        assert self.member.stdout.readline().strip() == f"assigned {len(topics) * PARTITIONS}"
        self.pipeline = build_pipeline(self.settings)
        self.runner = threading.Thread(target=self.pipeline.run, kwargs={"once": True}, daemon=True)
        self.started = time.monotonic()
        self.runner.start()
        source = self.pipeline.source
        assert isinstance(source, KafkaSource)
        while not source.assignment and time.monotonic() - self.started < 60:
            time.sleep(0.02)
        self.first_share = source.assignment
        assert 0 < len(self.first_share) < len(topics) * PARTITIONS, "the group did not split the partitions"

    def finish(self) -> float:
        """Seconds the `--once` run took."""
        self.runner.join(60)
        assert not self.runner.is_alive(), "the --once run did not finish"
        return time.monotonic() - self.started

    def close(self) -> None:
        self.member.kill()
        self.member.wait(10)


def test_once_waits_for_the_partitions_of_a_member_that_died(broker: TansuBroker, lakehouse: Path) -> None:  # noqa: F811
    """A member killed without leaving the group keeps its partitions until its session expires: a `--once` run
    must not stop at the end of its own share and leave them unread."""
    run = OnceBesideAMember(broker, lakehouse, "dead-member")
    run.close()
    run.finish()
    counts = bronze_coordinates(run.settings)
    assert set(counts) == run.expected, f"unread: {len(run.expected - set(counts))} records"
    assert set(counts.values()) == {1}


def test_once_leaves_a_live_member_its_share(
    broker: TansuBroker,  # noqa: F811
    lakehouse: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """With another live member, `--once` ends after the handover grace with its own share, and says so."""
    # The live member's session is longer than the run's: on a loaded machine a 2-second one could expire between
    # two heartbeats of its process, and the group hand the run every partition (seen once in CI).
    run = OnceBesideAMember(broker, lakehouse, "live-member", member_session_ms=8000)
    try:
        with caplog.at_level(logging.INFO, logger="ingest.sources.kafka"):
            took = run.finish()
    finally:
        run.close()
    counts = bronze_coordinates(run.settings)
    # Its share as it ended: the group may move a partition to it after its first assignment (seen under load).
    read = {c[:2] for c in counts}
    assert set(counts) == {c for c in run.expected if c[:2] in read}, "a partition of its share was not read whole"
    assert set(counts.values()) == {1}
    assert took >= 4.0  # twice the tests' session.timeout.ms
    held = sorted({c[:2] for c in run.expected} - read)
    assert held, "the run read the live member's partitions too"
    named = ", ".join(f"{topic}[{partition}]" for topic, partition in held)
    assert f"caught up on this member's share: {named} stayed with another member" in caplog.text, caplog.text


def test_once_waits_for_a_join_that_a_dead_member_holds_up(lakehouse: Path) -> None:
    """A member killed without leaving holds up the group's next join until its session ends. `--once` started
    meanwhile gave up waiting for its first assignment after 15 s and exited 0 having read nothing, as if the topic
    were empty. The mock cluster's coordinator holds the join (here for two sessions of 9 s: ~17 s)."""
    from ingest.sources.kafka import JOIN_GRACE_S

    topic = "dbserver1.inventory.customers"
    with MockKafkaCluster() as cluster:
        cluster.produce(topic, _customer_records(10))
        consumer = {**MOCK_CONSUMER_SETTINGS, "session.timeout.ms": "9000"}  # the mock holds a shorter one out
        settings = kafka_settings(lakehouse, cluster, topics=[topic], consumer=consumer)
        assert settings.source is not None
        member = subprocess.Popen(
            [
                sys.executable,
                "-c",
                SLOW_SESSION_MEMBER,
                cluster.bootstrap_servers,
                settings.source.group_id,
                topic,
                "9000",
            ],
            stdout=subprocess.PIPE,
            text=True,
        )
        assert member.stdout is not None
        assert member.stdout.readline().startswith("assigned ")
        member.kill()
        member.wait(10)
        started = time.monotonic()
        assert run_kafka(settings).stats.written == 10
        assert time.monotonic() - started > JOIN_GRACE_S  # the join took longer than a subscription without topics
    assert set(bronze_coordinates(settings)) == {(topic, 0, offset) for offset in range(10)}


def test_the_next_generation_group_protocol_reads_every_partition(lakehouse: Path) -> None:
    """KIP-848, `group.protocol: consumer`: the client refused to start with cdclake's own session and heartbeat
    settings, and without them the first assignment failed ("Failed to set assignment": its assignments are
    incremental, never a whole one)."""
    topic = "dbserver1.inventory.customers"
    with MockKafkaCluster() as cluster:
        for partition in range(2):
            cluster.produce(topic, _customer_records(5), partition=partition)
        source = {
            "type": "kafka",
            "bootstrap_servers": cluster.bootstrap_servers,
            "group_id": unique("kip848-"),
            "topics": [topic],
            "consumer": {"group.protocol": "consumer"},
        }
        settings = make_settings(lakehouse, source=source)
        assert run_kafka(settings).stats.written == 10
    assert set(bronze_coordinates(settings)) == {(topic, p, offset) for p in range(2) for offset in range(5)}


def _publish_one_by_one(
    broker: TansuBroker,  # noqa: F811
    topic: str,
    records: list[tuple[bytes | None, bytes | None]],
    partition: int,
) -> None:
    """Publish (key, value) pairs to one partition of ``topic`` (created with PARTITIONS partitions if new), each
    record a batch of its own."""
    publish(broker, [Record(topic, key, value, partition) for key, value in records], PARTITIONS, ONE_RECORD_BATCHES)


def test_status_shows_the_partitions_with_nothing_landed_yet(broker: TansuBroker, lakehouse: Path) -> None:  # noqa: F811
    """`cdclake status` listed only the partitions bronze holds offsets of: one whose records were never landed
    (its member stuck, ingest down since the topic got more partitions) was missing, and the table's lag said 0."""
    from ingest.status import collect_status, stale_problems

    topic = unique("st") + ".inventory.customers"
    records = _customer_records(10)
    _publish_one_by_one(broker, topic, records, partition=0)
    settings = kafka_settings(lakehouse, broker, topics=[topic])
    assert run_kafka(settings).stats.written == 10
    _publish_one_by_one(broker, topic, records[:5], partition=1)
    status = collect_status(settings)
    (table,) = status.tables
    offsets = [(p.partition, p.next_offset, p.lag) for p in table.partitions]
    assert offsets == [(0, 10, 0), (1, None, 5), (2, None, 0)]
    assert table.lag == 5
    # --max-lag: such a partition makes the status stale (the table's commit is fresh: nothing else would).
    assert stale_problems(status, 3600, max_lag=5) == []
    assert stale_problems(status, 3600, max_lag=4) == [
        f"{topic}[1]: 5 record(s) not landed in bronze.{topic.replace('.', '_')}, more than --max-lag 4"
    ]


@pytest.mark.parametrize("subscription", ["topics", "topic_pattern"])
def test_status_names_a_subscribed_topic_that_has_no_bronze_table(
    broker: TansuBroker,  # noqa: F811
    lakehouse: Path,
    subscription: str,
) -> None:
    """A topic of the subscription with records and no bronze table (ingest never got to it: not running, stuck,
    or started before the topic was added) was left out of `cdclake status`, which said "fresh". It is listed
    with its records, and is stale once its oldest record waited longer than --stale-after, as a table's last
    commit is. Heartbeat topics never land, and are not listed (those of another prefix than Debezium's default once
    source.heartbeat_topic_prefixes names it); nor is a topic without records."""
    from ingest.status import collect_status, idle_tables, stale_problems, status_document

    server = unique("sw")
    landed, waiting = f"{server}.inventory.customers", f"{server}.inventory.orders"
    heartbeat, empty = f"__debezium-heartbeat.{server}", f"{server}.inventory.empty"
    custom_heartbeat = f"{server}.heartbeats.{server}"  # topic.heartbeat.prefix: <server>.heartbeats
    records = _customer_records(10)
    _publish_one_by_one(broker, landed, records, partition=0)
    assert run_kafka(kafka_settings(lakehouse, broker, topics=[landed])).stats.written == 10
    _publish_one_by_one(broker, waiting, records[:3], partition=0)
    _publish_one_by_one(broker, waiting, records[:2], partition=2)
    _publish_one_by_one(broker, heartbeat, [(None, b'{"ts_ms": 1}')], partition=0)
    _publish_one_by_one(broker, custom_heartbeat, [(b'{"serverName": "x"}', b'{"ts_ms": 1}')], partition=0)
    broker.create_topics([empty], partitions=PARTITIONS)
    if subscription == "topics":
        settings = kafka_settings(lakehouse, broker, topics=[landed, waiting, heartbeat, custom_heartbeat, empty])
    else:
        settings = kafka_settings(lakehouse, broker, topic_pattern=rf"^{re.escape(server)}\.")
    produced_by = dt.datetime.now(dt.UTC)
    # A heartbeat topic of another prefix than Debezium's default is known by its prefix, once status is told it.
    assert collect_status(settings).topics_without_table == {waiting: 5, custom_heartbeat: 1}
    assert settings.source is not None
    source = settings.source.model_copy(update={"heartbeat_topic_prefixes": [f"{server}.heartbeats"]})
    settings = settings.model_copy(update={"source": source})
    status = collect_status(settings)
    assert [table.name for table in status.tables] == [f"{server}_inventory_customers"]
    assert status.topics_without_table == {waiting: 5}
    since = status.topics_without_table_since[waiting]
    assert produced_by - dt.timedelta(minutes=1) < since <= produced_by
    assert stale_problems(status, 3600) == []  # waited less than --stale-after, as a table committed that recently
    later = stale_problems(status, 3600, now=since + dt.timedelta(hours=2))
    assert later[0] == (
        f"topic {waiting}: 5 record(s) in the cluster for 2h00m and no bronze table: nothing of it has landed (is "
        "ingest running, and does its subscription take the topic? A heartbeat topic: name its prefix in "
        "source.heartbeat_topic_prefixes)"
    )
    # The landed table committed as long ago, but nothing waits for it (lag 0): idle, not stale.
    assert later[1:] == []
    idle = idle_tables(status, 3600, now=since + dt.timedelta(hours=2))
    assert idle == [f"bronze.{server}_inventory_customers"]
    assert status_document(status, 3600, later)["topics_without_table"] == {
        waiting: {"records": 5, "since": since.isoformat().replace("+00:00", "Z")}
    }


def _customer_records(count: int) -> list[tuple[bytes | None, bytes | None]]:
    """The first ``count`` change records of the real PostgreSQL customers topic, as (key, value) bytes."""
    lines = [orjson.loads(line) for line in PG_DUMP.read_bytes().splitlines() if line.strip()]
    customers = [line for line in lines if line["topic"] == "dbserver1.inventory.customers" and line["payload"]]
    assert len(customers) >= count
    return [(line["key"].encode(), line["payload"].encode()) for line in customers[:count]]


def test_a_partition_whose_bronze_offset_the_log_no_longer_holds_stops_ingest(
    lakehouse: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Bronze resumes a partition at an offset the topic's log does not hold (records deleted by retention before
    they were landed, the topic deleted and created again, another cluster): the service stops and names the
    partition instead of silently jumping (with librdkafka's default `earliest`, over the deleted records).
    Tansu never answers OFFSET_OUT_OF_RANGE, so librdkafka's mock cluster plays the broker."""
    topic = "dbserver1.inventory.customers"
    records = _customer_records(10)
    with MockKafkaCluster() as first:
        first.produce(topic, records)
        settings = kafka_settings(lakehouse, first, topics=[topic], consumer=MOCK_CONSUMER_SETTINGS)
        assert run_kafka(settings).stats.written == 10
    landed = bronze_coordinates(settings)
    assert set(landed) == {(topic, 0, offset) for offset in range(10)}

    # The topic is created again (here: on another cluster) and holds 3 records: offsets 0-2, below bronze's 10.
    with MockKafkaCluster() as second:
        second.produce(topic, records[:3])
        settings = kafka_settings(lakehouse, second, topics=[topic], consumer=MOCK_CONSUMER_SETTINGS)
        message = rf"^{re.escape(topic)}\[0\]: bronze resumes this partition at offset 10, .*no longer holds.*"
        with pytest.raises(OffsetOutOfRangeError, match=message + r"source\.consumer\.auto\.offset\.reset: earliest$"):
            run_kafka(settings)
        assert bronze_coordinates(settings) == landed

        # Accepting the gap is the user's choice. librdkafka then moves the partition to the log's first offset and
        # warns; records at offsets bronze holds already count as landed (see operations.md for a recreated topic).
        accepted = kafka_settings(
            lakehouse, second, topics=[topic], consumer={**MOCK_CONSUMER_SETTINGS, "auto.offset.reset": "earliest"}
        )
        with caplog.at_level(logging.WARNING, logger="ingest.sources.kafka"):
            assert run_kafka(accepted).stats.written == 0
        resets = [r.getMessage() for r in caplog.records if "offset reset" in r.getMessage()]
        assert resets
        assert f"{topic} [0]: offset reset (at offset 10" in resets[0]
        assert bronze_coordinates(accepted) == landed

        # The command line: one line naming the partition, a failed exit.
        root = logging.getLogger()
        monkeypatch.setattr(root, "handlers", list(root.handlers))  # `cdclake` configures logging globally
        monkeypatch.setattr(root, "level", root.level)
        kafka_settings(lakehouse, second, topics=[topic], consumer=MOCK_CONSUMER_SETTINGS)  # writes cdclake.yml again
        config = lakehouse / "cdclake.yml"
        monkeypatch.setattr(sys, "argv", ["cdclake", "--config", str(config), "ingest", "--once", "--no-progress"])
        with pytest.raises(SystemExit) as exited:
            cli_main()
        assert exited.value.code != 0
        assert re.search(
            rf"error: {re.escape(topic)}\[0\]: bronze resumes this partition at offset 10", capsys.readouterr().err
        )
        assert bronze_coordinates(settings) == landed


@pytest.mark.parametrize(
    ("poll_size", "background_decode"),
    [(None, True), (None, False), (4, True)],
    ids=["fast-path", "fast-path-in-the-read-loop", "per-record"],
)
def test_a_client_that_goes_back_lands_each_record_once(
    broker: TansuBroker,  # noqa: F811
    lakehouse: Path,
    caplog: pytest.LogCaptureFixture,
    poll_size: int | None,
    background_decode: bool,
) -> None:
    """With auto.offset.reset: earliest, a client whose fetch position the broker lost (an unclean leader election)
    starts the partition again from its first offset and hands over records it handed over before. Those still in
    the buffer, not committed yet, landed twice. The client is sent back here as librdkafka's reset does (a seek to
    the log's start) after the first polls, with nothing committed yet; every record lands once."""
    from confluent_kafka import TopicPartition

    from ingest.cli.ingest_cmd import build_pipeline

    prefix = unique("rw") + "."
    stream = build_stream("db2", seed=5, n_keys=20, n_changes=60, partitions=1)
    records = retopic(stream.records, prefix)
    expected = publish(broker, records, 1)
    topics = sorted({r.topic for r in records})
    settings = kafka_settings(  # one commit, at the end
        lakehouse, broker, topics=topics, latency_threshold_s=600, background_decode=background_decode
    )
    pipeline = build_pipeline(settings)
    poll = pipeline.source.poll
    read: list[int] = []
    sent_back: set[str] = set()

    def poll_then_go_back(max_records: int, timeout_s: float) -> list[Any]:
        batch = poll(poll_size or max_records, timeout_s)
        read.append(len(batch))
        if batch and sum(read) >= 12 and not sent_back:
            sent_back.update(r.topic for r in batch if r.offset > 0)
            consumer = pipeline.source._consumer  # type: ignore[attr-defined]
            for topic in sent_back:
                consumer.seek(TopicPartition(topic, 0, 0))
        return batch

    pipeline.source.poll = poll_then_go_back  # type: ignore[method-assign]
    with caplog.at_level(logging.WARNING, logger="ingest.pipeline"):
        pipeline.run(once=True)
    assert sent_back
    assert pipeline.stats.records_in > len(records)  # some records came twice
    assert pipeline.stats.records_in == sum(read)  # each record handed over counted once, taken again or not
    assert pipeline.stats.flushes == 1
    counts = bronze_coordinates(settings)
    assert set(counts) == expected
    assert set(counts.values()) == {1}
    skipped = pipeline.stats.records_in - len(records)
    assert pipeline.stats.skipped >= skipped
    warnings = [r.getMessage() for r in caplog.records if "the Kafka client went back to offset 0" in r.getMessage()]
    assert sorted(w.split("[")[0] for w in warnings) == sorted(sent_back), caplog.text  # once each, not per record
    assert "after reading up to offset " in warnings[0]


def _once_against_no_cluster(lakehouse: Path, servers: str, **consumer: str) -> subprocess.CompletedProcess[str]:
    """`cdclake ingest --once` (a process of its own) at ``servers``, with ingest.unhealthy_after_s 3: it must end
    within 30 s (before, these runs waited for ever or for minutes: the timeout makes that a failure)."""
    from tests.processes import cdclake_command

    source = {
        "type": "kafka",
        "bootstrap_servers": servers,
        "topics": ["dbserver1.inventory.customers"],
        "group_id": unique("cdclake-test-"),
        "consumer": consumer,
    }
    make_settings(lakehouse, source=source, ingest={"unhealthy_after_s": 3})
    started = time.monotonic()
    done = subprocess.run(
        [cdclake_command(), "--config", str(lakehouse / "cdclake.yml"), "--log-format", "text", "ingest", "--once"],
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
    )
    assert done.returncode == 2, done.stderr
    assert time.monotonic() - started < 30
    return done


def test_once_gives_up_when_no_broker_answers_and_the_client_reports_nothing(lakehouse: Path) -> None:
    """SASL/OAUTHBEARER with no token source: librdkafka waits for a token and reports no error, so the run waited
    for the group join's deadline (over 5 minutes) and then blamed the consumer group. It now gives up after
    ingest.unhealthy_after_s, naming the servers and the security settings to check."""
    consumer = {"security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "OAUTHBEARER"}
    done = _once_against_no_cluster(lakehouse, "127.0.0.1:1", **consumer)
    assert "error: kafka: no broker answered a metadata request in " in done.stderr
    assert "(ingest.unhealthy_after_s: 3)" in done.stderr
    assert "bootstrap_servers: 127.0.0.1:1; check them and the security settings in source.consumer" in done.stderr


def test_once_gives_up_on_a_cluster_it_cannot_reach(lakehouse: Path) -> None:
    """`--once` against a cluster no broker of which answers waited for ever (the service rightly does: librdkafka
    reconnects and /healthz says why), so a scheduled run hung instead of failing. It now gives up after
    ingest.unhealthy_after_s, exit status 2, naming the servers and librdkafka's last error."""
    import socket

    with socket.socket() as probe:  # a loopback port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    done = _once_against_no_cluster(lakehouse, f"127.0.0.1:{port}")
    assert re.search(r"error: kafka: no broker reachable since \S+ \(last error: .*Connection refused", done.stderr)
    assert "--once gave up after " in done.stderr
    assert f"bootstrap_servers: 127.0.0.1:{port}" in done.stderr
    # librdkafka retried the connection every 0.5 s: its error line is logged once a minute (RepeatFilter).
    failures = [line for line in done.stderr.splitlines() if "FAIL [rdkafka#consumer" in line]
    assert len(failures) == 1, done.stderr


def test_once_commits_what_it_read_before_the_cluster_went_away(lakehouse: Path) -> None:
    """A `--once` run whose cluster goes away mid-topic gives up (above) and commits the records it read first:
    the next run resumes after them, nothing lost, nothing twice. The client fetches one record batch at a time
    (each record is a batch of its own, and its queue holds about one), each poll hands over one record, and the mock
    cluster stops as the first poll that read a record returns: the run is a few records into a topic of 300. (It
    stopped at the first progress report, by which a slow machine's polls, 0.2 s each, had read the whole topic of
    12: CI saw it once.)"""
    from ingest.cli.ingest_cmd import build_pipeline

    topic = "dbserver1.inventory.customers"
    records = _customer_records(12) * 25  # the same changes again: offsets are what count here
    cluster = MockKafkaCluster().start()
    try:
        for record in records:
            cluster.produce(topic, [record])
        consumer = {
            **MOCK_CONSUMER_SETTINGS,
            "max.partition.fetch.bytes": "1",
            "queued.max.messages.kbytes": "1",
            "queued.min.messages": "1",
        }
        # Nothing is committed before the run ends (no latency flush): what bronze holds, the end committed.
        settings = kafka_settings(
            lakehouse, cluster, topics=[topic], consumer=consumer, unhealthy_after_s=1, latency_threshold_s=600
        )
        pipeline = build_pipeline(settings)

        poll = pipeline.source.poll

        def poll_then_stop_the_cluster(max_records: int, timeout_s: float) -> list[Any]:
            # One record per poll: consume() gathers records until its count or its timeout, which on a loaded
            # machine may be the whole topic (CI once saw all 60 records read before the cluster stopped).
            batch = poll(1, timeout_s)
            if batch:
                cluster.stop()  # the next calls find it stopped: a no-op
            return batch

        pipeline.source.poll = poll_then_stop_the_cluster  # type: ignore[method-assign]
        outcome: list[BaseException] = []

        def run() -> None:
            try:
                pipeline.run(once=True)
            except BaseException as exc:  # handed to the test's thread
                outcome.append(exc)

        thread = threading.Thread(target=run)
        thread.start()
        thread.join(60)
        if thread.is_alive():  # before, the run waited for the cluster for ever
            pipeline.stop_requested.set()
            thread.join(60)
            pytest.fail("--once kept waiting for the cluster")
    finally:
        cluster.stop()
    assert len(outcome) == 1, outcome
    assert isinstance(outcome[0], ClusterUnreachableError), outcome
    assert "--once gave up after" in str(outcome[0])
    read = pipeline.stats.records_in
    assert 0 < read < len(records)
    assert bronze_coordinates(settings) == {(topic, 0, offset): 1 for offset in range(read)}


def test_a_transactional_topic_read_to_its_end_has_no_lag(lakehouse: Path) -> None:
    """Kafka Connect's exactly-once source support writes each batch in a transaction: its commit marker takes an
    offset and is never delivered. Read to the end, a partition's lag is 0, not 1 per marker (its position was its
    last record + 1, short of the end by the marker). The mock cluster serves transactions; Tansu's are partial."""
    topic = "dbserver1.inventory.customers"
    records = _customer_records(6)
    with MockKafkaCluster() as cluster:
        producer = Producer({"bootstrap.servers": cluster.bootstrap_servers, "transactional.id": unique("tx-")})
        producer.init_transactions(10)
        for batch in (records[:3], records[3:]):
            producer.begin_transaction()
            for key, value in batch:
                producer.produce(topic, key=key, value=value, partition=0)
            producer.commit_transaction(10)
        settings = kafka_settings(
            lakehouse, cluster, topics=[topic], consumer={**MOCK_CONSUMER_SETTINGS, "isolation.level": "read_committed"}
        )
        pipeline = run_kafka(settings)
    assert pipeline.stats.written == 6
    assert set(bronze_coordinates(settings)) == {(topic, 0, offset) for offset in (0, 1, 2, 4, 5, 6)}  # 3, 7: markers
    lag = pipeline.metrics.registry.get_sample_value("cdclake_consumer_lag", {"topic": topic, "partition": "0"})
    assert lag == 0
