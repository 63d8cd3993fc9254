"""Debezium topics on a Kafka cluster (confluent-kafka / librdkafka).

Partitions are positioned from bronze's own offsets on every assignment, so a restart or a rebalance resumes
exactly where the bronze tables say; the consumer group's committed offsets are written for monitoring only.
Catch-up for ``--once`` is detected with partition EOF events, not with ListOffsets (unreliable on some
Kafka-protocol brokers). Caught up also means every partition of the subscription is read here, or has stayed
with another member of the group for a handover grace (twice ``session.timeout.ms``): a member that died without
leaving (SIGKILL, a lost container, static membership) keeps its partitions until its session expires, and a
``--once`` run that stopped at the end of its own share would silently leave them unread.

Broker outages: librdkafka reconnects by itself (``reconnect.backoff.ms`` .. ``reconnect.backoff.max.ms``). Its
global errors (``error_cb``: all brokers down, transport, authentication, TLS) mark the source *unreachable*: then
it is not caught up (so an idle service stops reporting progress and ``/healthz`` fails after
``ingest.unhealthy_after_s``) and ``on_health`` gets the reason. A metadata request that succeeds (tried at most
every ``PROBE_INTERVAL_S`` while unreachable) marks it reachable again; records still in the client's queue are
no proof of that. ``--once`` does not wait for ever: unreachable for ``give_up_after_s`` (``unhealthy_after_s``),
it raises :class:`ClusterUnreachableError` (what it read is committed when the closing consumer revokes its
partitions).
"""

from __future__ import annotations

import difflib
import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, Message, TopicPartition

from ingest.config import SECRET_KEY_PATTERN, SourceSettings
from ingest.debezium.envelope import RawRecord
from ingest.errors import CdclakeError, ConfigError
from ingest.logs import RepeatFilter
from ingest.sources.base import OffsetResolver, TopicSelection
from ingest.text import first_few

log = logging.getLogger(__name__)
# librdkafka's own log lines, each repeated warning or error once a minute (RepeatFilter says why).
librdkafka_log = logging.getLogger(f"{__name__}.librdkafka")
librdkafka_log.addFilter(RepeatFilter())

RevokeHook = Callable[[list[tuple[str, int]]], None]
# Called with a reason when no broker can be reached, and with None once one answers again.
HealthHook = Callable[[str | None], None]
# librdkafka's global errors that mean "cannot talk to the cluster" (it keeps retrying by itself).
UNREACHABLE_ERRORS = frozenset(
    {
        KafkaError._ALL_BROKERS_DOWN,
        KafkaError._TRANSPORT,
        KafkaError._RESOLVE,
        KafkaError._AUTHENTICATION,
        KafkaError._SSL,
    }
)
PROBE_INTERVAL_S = 1.0
# How often the subscription's partitions are re-read from metadata while everything assigned is read to its end.
SUBSCRIPTION_REFRESH_S = 2.0
# Before the first assignment: how long (while the cluster answers) a subscription without partitions is waited for
# before ``--once`` calls it nothing to read (Debezium creates topics lazily).
JOIN_GRACE_S = 15.0


class KafkaSourceError(CdclakeError):
    """The broker reported an error the client cannot recover from (message names topic/partition)."""


class ClusterUnreachableError(KafkaSourceError):
    """``--once``: no broker answered for ``give_up_after_s``; a scheduled run fails instead of waiting for ever.
    Closing the consumer revokes its partitions, and the pipeline commits what it read before (``revoke``)."""


class GroupJoinTimeoutError(KafkaSourceError):
    """``--once``: the subscription has partitions, and the group assigned this member none of them in time."""


class OffsetOutOfRangeError(KafkaSourceError):
    """A partition's offset from bronze is not in the topic's log: the records from there were deleted (retention, a
    recreated topic, another cluster). Going on would skip or re-number records, so it is refused by default."""


def consumer_config(settings: SourceSettings) -> dict[str, Any]:
    config: dict[str, Any] = {
        "bootstrap.servers": settings.bootstrap_servers,
        "group.id": settings.group_id,
        "enable.auto.commit": False,
        "enable.auto.offset.store": False,
        "enable.partition.eof": True,
        # Partitions start from bronze's offsets (or the beginning). One that is out of the log's range means
        # records were deleted before they were landed: stop and say so rather than silently jump over them.
        "auto.offset.reset": "error",
        "session.timeout.ms": 6000,
        "heartbeat.interval.ms": 1000,
        "topic.metadata.refresh.interval.ms": 5000,
        # While the cluster is down librdkafka retries a refused connection every reconnect.backoff.ms / 2 (its
        # exponential growth does not apply there): 100 ms by default means 20 attempts and error lines a second.
        "reconnect.backoff.ms": 1000,
        "reconnect.backoff.max.ms": 10000,
        "fetch.max.bytes": 64 * 1024 * 1024,
        "queued.max.messages.kbytes": 256 * 1024,
        # Once a partition's prefetch queue is full (queued.min.messages or the kbytes above), librdkafka waits this
        # long before it fetches again: 1 s by default, while a busy reader drains the queue in a fraction of it and
        # then waits in consume(). That wait capped catch-up at ~140k events/s even for a bare consumer.
        "fetch.queue.backoff.ms": 10,
    }
    # User settings (security.protocol, sasl.*, ssl.*, ...) pass through unchanged and win.
    user = settings.consumer_config()
    if _next_generation_protocol(user):
        # KIP-848: the broker owns session and heartbeat timing, and the client refuses to start with them set.
        for key in ("session.timeout.ms", "heartbeat.interval.ms"):
            config.pop(key)
    config.update(user)
    return config


def _next_generation_protocol(config: Mapping[str, Any]) -> bool:
    """``group.protocol: consumer`` (KIP-848): assignments change incrementally, as with cooperative assignors."""
    return str(config.get("group.protocol", "classic")).lower() == "consumer"


def _out_of_range(
    tp: tuple[str, int], error: KafkaError, start: int | None, position: int | None
) -> OffsetOutOfRangeError:
    """``start``: where the partition was assigned from (None: the beginning); ``position``: its next offset, once
    records of it were read."""
    topic, partition = tp
    if position is not None:  # read for a while: retention deleted records before they were read
        where = f"ingest reads this partition at offset {position}, which the topic's log no longer holds"
    elif start is None:  # read from the beginning: retention moved the log's start while the client looked it up
        where = "this partition holds no offset in bronze, and the topic's log start moved while it was read"
    else:
        where = f"bronze resumes this partition at offset {start}, which the topic's log no longer holds"
    return OffsetOutOfRangeError(
        f"{topic}[{partition}]: {where} ({error.str()}). The records from there were deleted before they were "
        "landed (retention, or the topic was deleted and created again, or this is another cluster); nothing was "
        "skipped and ingest stopped (on a transactional topic idle longer than its retention, the one offset "
        "missing can be a commit marker: see operations.md). To go on from the earliest offset the topic still "
        "holds, accepting the gap, set source.consumer.auto.offset.reset: earliest"
    )


def _coordinates(message: Message) -> tuple[str, int, int]:
    """Topic, partition and offset; always set on data and EOF messages (the stubs allow None)."""
    topic, partition, offset = message.topic(), message.partition(), message.offset()
    assert topic is not None
    assert partition is not None
    return topic, partition, -1 if offset is None else offset


class KafkaSource:
    def __init__(
        self,
        settings: SourceSettings,
        on_revoke: RevokeHook | None = None,
        on_health: HealthHook | None = None,
        give_up_after_s: float | None = None,
    ) -> None:
        self.settings = settings
        self.on_revoke = on_revoke
        self.on_health = on_health
        # --once: how long the cluster may stay unreachable before caught_up raises (None: waited for, always).
        self.give_up_after_s = give_up_after_s
        self._consumer: Consumer | None = None
        self._resolve: OffsetResolver | None = None
        self._assigned: set[tuple[str, int]] = set()
        self._at_eof: set[tuple[str, int]] = set()
        self._positions: dict[tuple[str, int], int] = {}
        self._starts: dict[tuple[str, int], int | None] = {}  # where each assigned partition started (None: beginning)
        self._join_started_at = 0.0  # since when the first assignment is awaited with the cluster reachable
        self._join_deadline_s = 60.0
        self._join_warned = False
        self._missing_warned: set[str] = set()  # subscribed topics the cluster does not have, warned about
        self._assigned_once = False
        self._assignment_changed_at = 0.0
        # The subscription's partitions per the cluster's metadata, and when they were read (None: never).
        self._subscribed: set[tuple[str, int]] = set()
        self._subscribed_at: float | None = None
        self._subscribed_known = False  # a metadata request answered once
        self._reported_held: frozenset[tuple[str, int]] = frozenset()  # what was logged, to log each change once
        self._accepted_held: frozenset[tuple[str, int]] = frozenset()
        # Held by other members when last looked at (None: not yet; the first look is the baseline), and when a
        # partition last joined them.
        self._held: frozenset[tuple[str, int]] | None = None
        self._held_grew_at = 0.0
        self._next_generation = False  # group.protocol consumer (KIP-848)
        self._metadata_refresh_s = 5.0
        self._handover_grace_s = 12.0
        self._selection = TopicSelection.of(settings.topics, settings.topic_pattern)
        self._cooperative = False
        # Set while no broker can be reached: (unix time it started, librdkafka's last error text).
        self._unreachable: tuple[float, str] | None = None
        self._probed_at = 0.0

    # -- lifecycle -------------------------------------------------------------------------------------------
    def start(self, resolve: OffsetResolver) -> None:
        self._resolve = resolve
        config = consumer_config(self.settings)
        config["error_cb"] = self._on_error
        session_s = int(config.get("session.timeout.ms", 45000)) / 1000
        self._handover_grace_s = 2 * session_s
        # The coordinator completes a join once the members it waits for rejoined or timed out: a member that died
        # holds its partitions for its session.timeout.ms (the same setting as this one's, usually), a busy one for
        # up to its max.poll.interval.ms.
        max_poll_s = int(config.get("max.poll.interval.ms", 300000)) / 1000
        self._join_deadline_s = JOIN_GRACE_S + max(45.0, 3 * session_s, max_poll_s + session_s)
        strategy = str(config.get("partition.assignment.strategy", "")).lower()
        self._next_generation = _next_generation_protocol(config)
        self._metadata_refresh_s = int(config.get("topic.metadata.refresh.interval.ms", 300000)) / 1000
        self._cooperative = "cooperative" in strategy or self._next_generation
        try:
            self._consumer = Consumer(config, logger=librdkafka_log)
        except KafkaException as exc:  # an unknown or malformed librdkafka setting under source.consumer
            error = exc.args[0] if exc.args else exc
            reason = error.str() if isinstance(error, KafkaError) else str(error)
            for key, value in self.settings.consumer_config().items():
                if SECRET_KEY_PATTERN.search(key) and len(value) >= 4:
                    reason = reason.replace(value, "***")
            raise ConfigError(f"source.consumer: the Kafka client rejected the settings: {reason}") from None
        pattern = self._selection.pattern
        subscription = [pattern.pattern] if pattern is not None else list(self.settings.topics)
        self._consumer.subscribe(subscription, on_assign=self._assign, on_revoke=self._revoke, on_lost=self._revoke)
        self._join_started_at = time.monotonic()

    def close(self) -> None:
        if self._consumer is not None:
            self._consumer.close()
            self._consumer = None

    # -- rebalance callbacks (run inside poll) --------------------------------------------------------------
    def _assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        assert self._resolve is not None
        for partition in partitions:
            start = self._resolve(partition.topic, partition.partition)
            partition.offset = OFFSET_BEGINNING if start is None else start
            tp = (partition.topic, partition.partition)
            self._starts[tp] = start
            self._positions.pop(tp, None)
            self._assigned.add(tp)
            self._at_eof.discard(tp)
            log.info("assigned %s[%d] from offset %s", tp[0], tp[1], "beginning" if start is None else start)
        # The cooperative protocol hands over only the changed partitions; the eager one the whole assignment.
        if self._cooperative:
            consumer.incremental_assign(partitions)
        else:
            consumer.assign(partitions)
        self._assigned_once = True
        self._assignment_changed_at = time.monotonic()

    def _revoke(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        lost = [(p.topic, p.partition) for p in partitions]
        if self.on_revoke is not None and lost:
            # Commit what is buffered for these partitions before another process takes them over.
            self.on_revoke(lost)
        for tp in lost:
            self._assigned.discard(tp)
            self._at_eof.discard(tp)
            self._positions.pop(tp, None)
        self._assignment_changed_at = time.monotonic()
        if self._cooperative:
            consumer.incremental_unassign(partitions)
        else:
            consumer.unassign()

    # -- broker reachability --------------------------------------------------------------------------------------
    def _on_error(self, error: KafkaError) -> None:
        """librdkafka's global errors (served inside consume/poll). It retries by itself; we only keep the state."""
        if error.code() not in UNREACHABLE_ERRORS:
            log.warning("kafka: %s", error.str())
            return
        if self._unreachable is None:
            log.warning("kafka: cannot reach the cluster (%s); the client keeps reconnecting with backoff", error.str())
            self._unreachable = (time.time(), error.str())
            self._probed_at = time.monotonic()
        else:
            self._unreachable = (self._unreachable[0], error.str())
        if self.on_health is not None:
            self.on_health(self.health_reason)

    def _reachable(self) -> None:
        if self._unreachable is None:
            return
        log.info("kafka: the cluster is reachable again after %.1fs", time.time() - self._unreachable[0])
        self._unreachable = None
        if not self._assigned_once:
            self._join_started_at = time.monotonic()  # the join starts now: the time unreachable does not count
        if self.on_health is not None:
            self.on_health(None)

    def _probe(self, timeout_s: float) -> None:
        """While unreachable and idle: a metadata request tells whether a broker answers again."""
        assert self._consumer is not None
        if self._unreachable is None or time.monotonic() - self._probed_at < PROBE_INTERVAL_S:
            return
        self._probed_at = time.monotonic()
        try:
            self._consumer.list_topics(timeout=max(min(timeout_s, 0.5), 0.05))
        except KafkaException:
            return
        self._reachable()

    def _give_up_if_unreachable_too_long(self) -> None:
        """``--once`` stops waiting for a cluster that stayed unreachable for ``give_up_after_s``: a scheduler must
        see the run fail, not hang. (The service waits on: librdkafka reconnects, and ``/healthz`` reports it.)"""
        if self._unreachable is None or self.give_up_after_s is None:
            return
        waited = time.time() - self._unreachable[0]
        if waited >= self.give_up_after_s:
            raise ClusterUnreachableError(
                f"{self.health_reason}; --once gave up after {waited:.0f}s (ingest.unhealthy_after_s: "
                f"{self.give_up_after_s:g}). bootstrap_servers: {self.settings.bootstrap_servers}. The records read "
                "before are committed on the way out; the next run resumes from bronze's offsets"
            )

    @property
    def health_reason(self) -> str | None:
        """Why the source cannot make progress (None when it can)."""
        if self._unreachable is None:
            return None
        since, error = self._unreachable
        at = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(since))
        return f"kafka: no broker reachable since {at} (last error: {error})"

    # -- reading ----------------------------------------------------------------------------------------------
    def poll(self, max_records: int, timeout_s: float) -> list[RawRecord]:
        assert self._consumer is not None, "start() first"
        self._probe(timeout_s)
        messages = self._consumer.consume(num_messages=max_records, timeout=timeout_s)
        batch: list[RawRecord] = []
        append = batch.append
        eof_at: list[tuple[int, tuple[str, int], int]] = []  # (records before it, partition, offset) of each end event
        # The hot loop of the read stage, once per message: the accessor calls and one tuple, nothing else
        # (tuple.__new__ directly: a named tuple's own __new__ is a Python function, ~40% of building one).
        new = tuple.__new__
        for message in messages:
            error = message.error()
            if error is not None:
                if error.code() == KafkaError._PARTITION_EOF:
                    topic, partition, end = _coordinates(message)
                    eof_at.append((len(batch), (topic, partition), end))
                    continue
                if error.code() == KafkaError._AUTO_OFFSET_RESET:
                    tp = _coordinates(message)[:2]
                    raise _out_of_range(tp, error, self._starts.get(tp), self._positions.get(tp))
                # Debezium creates topics lazily: a topic that does not exist yet is waited for, not fatal.
                if error.fatal() or error.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED:
                    raise KafkaSourceError(f"{message.topic()}[{message.partition()}]: {error.str()}")
                if error.code() == KafkaError.UNKNOWN_TOPIC_OR_PART and message.topic():
                    self._warn_missing_topic(str(message.topic()))
                else:
                    log.warning("kafka: %s", error.str())
                continue
            offset = message.offset()
            timestamp_type, timestamp = message.timestamp()
            append(
                new(
                    RawRecord,
                    (
                        message.topic(),
                        message.partition(),
                        -1 if offset is None else offset,
                        timestamp if timestamp_type else None,
                        message.key(),
                        message.value(),
                        message.headers() or None,  # [] from some brokers: a v2 record always has a count
                    ),
                )
            )
        self._note_positions(batch, eof_at)
        return batch

    def _note_positions(self, batch: list[RawRecord], eof_at: list[tuple[int, tuple[str, int], int]]) -> None:
        """After a poll: each partition's next offset (its last record's + 1, or where an end-of-partition event after
        it says the partition ends: past the commit markers of a transactional producer, which take an offset and
        are never delivered), and which partitions are at their end (such an event with no record after it)."""
        last: dict[tuple[str, int], int] = {}  # partition -> position of its last record in the batch
        wanted = len(self._assigned)
        for position in range(len(batch) - 1, -1, -1):  # from the end: usually a few records find every partition
            record = batch[position]
            tp = (record.topic, record.partition)
            if tp not in last:
                last[tp] = position
                self._positions[tp] = record.offset + 1
                if wanted and len(last) >= wanted and all(assigned in last for assigned in self._assigned):
                    break
        for tp in last:
            self._at_eof.discard(tp)
        for before, tp, end in eof_at:
            if last.get(tp, -1) < before:
                self._at_eof.add(tp)
                if end > self._positions.get(tp, -1):
                    self._positions[tp] = end

    @property
    def assignment(self) -> frozenset[tuple[str, int]]:
        """The partitions this member reads now."""
        return frozenset(self._assigned)

    def caught_up(self, once: bool = False) -> bool:
        if self._unreachable is not None:
            if once:
                self._give_up_if_unreachable_too_long()
            return False  # cannot tell, and no progress is being made: not caught up
        if not self._assigned_once:
            if not (self._next_generation and time.monotonic() - self._join_started_at >= JOIN_GRACE_S):
                return self._nothing_to_join(once)
            # KIP-848 joins without a stop-the-world rebalance, and librdkafka reports no empty assignment: none
            # after the grace is taken as an empty one, whose partitions are held elsewhere (a dead member's until
            # its session ends, then handed over) or not at all (no such topic).
            self._assigned_once, self._assignment_changed_at = True, time.monotonic()
        if not self._assigned <= self._at_eof:
            return False
        held = self._held_elsewhere()
        now = time.monotonic()
        if self._held is None:
            # The first look, once this member's partitions are read: a partition that appeared lately (a topic
            # created, partitions added) is assigned after librdkafka's next metadata refresh and a rebalance. One
            # held by a live member since the assignment is not waited for again, but for that refresh.
            self._held_grew_at = now - max(self._handover_grace_s - self._metadata_refresh_s, 0.0)
        elif held - self._held:  # new partitions: the rebalance that assigns them is still to come
            self._held_grew_at = now
        self._held = held
        if not held:
            return True
        # Partitions of the subscription that another member holds: a dead one loses them when its session
        # expires, and the rebalance that follows changes this member's assignment. Unchanged for the grace: the
        # holders are alive and read them.
        stable_for = time.monotonic() - max(self._assignment_changed_at, self._held_grew_at)
        if held != self._reported_held:
            self._reported_held = held
            log.info(
                "read to the end of the %d assigned partition(s); %d other(s) are held by another member of group "
                "%r (%s): waiting up to %.0fs for them to be handed over",
                len(self._assigned),
                len(held),
                self.settings.group_id,
                _partition_list(held),
                self._handover_grace_s,
            )
        if stable_for < self._handover_grace_s:
            return False
        if held != self._accepted_held:
            self._accepted_held = held
            log.info(
                "caught up on this member's share: %s stayed with another member of group %r for %.0fs",
                _partition_list(held),
                self.settings.group_id,
                stable_for,
            )
        return True

    def _nothing_to_join(self, once: bool) -> bool:
        """Before the first assignment: True once the subscription has no partition to wait for (no such topic).
        While it has some, the join is waited for; past the join deadline ``once`` gives up with an error (it would
        otherwise exit as if it had read everything), the service warns and goes on waiting."""
        waited = time.monotonic() - self._join_started_at
        if once and not self._subscribed_known and self.give_up_after_s is not None and waited >= self.give_up_after_s:
            # No broker answered, and the client reported no error either (no broker named, a SASL mechanism
            # waiting for a token, a proxy that accepts and stays silent): what error_cb would have ended.
            self._held_elsewhere()  # a metadata request
            if not self._subscribed_known:
                raise ClusterUnreachableError(
                    f"kafka: no broker answered a metadata request in {waited:.0f}s, and the client reported no "
                    f"error; --once gave up (ingest.unhealthy_after_s: {self.give_up_after_s:g}). "
                    f"bootstrap_servers: {self.settings.bootstrap_servers}; check them and the security settings "
                    "in source.consumer (security.protocol, sasl.*, ssl.*)"
                )
        if waited < JOIN_GRACE_S:
            return False
        pending = self._held_elsewhere()  # nothing assigned yet: every partition of the subscription
        if not pending and self._subscribed_known:
            return True
        if waited < self._join_deadline_s:
            return False
        what = (
            f"the cluster has {len(pending)} partition(s) of the subscription ({_partition_list(pending)})"
            if pending
            else "no metadata request was answered"
        )
        message = (
            f"kafka: group {self.settings.group_id!r} assigned this member no partition in {waited:.0f}s, "
            f"while {what}. "
            "A member that stopped without leaving holds its partitions until its session.timeout.ms ends; a "
            "rebalance waits up to max.poll.interval.ms for a member that is still busy"
        )
        if once:
            raise GroupJoinTimeoutError(f"{message}. Nothing was read; run again, or look at the group's members")
        if not self._join_warned:
            self._join_warned = True
            log.warning("%s; still waiting for the group", message)
        return False

    def _held_elsewhere(self) -> frozenset[tuple[str, int]]:
        """Partitions of the subscription (per the cluster's metadata) that are not assigned to this member."""
        assert self._consumer is not None
        now = time.monotonic()
        if self._subscribed_at is None or now - self._subscribed_at >= SUBSCRIPTION_REFRESH_S:
            self._subscribed_at = now
            try:
                metadata = self._consumer.list_topics(timeout=5.0)
            except KafkaException as exc:  # cannot tell: judge by what was read before (if anything)
                log.debug("metadata request failed: %s", exc)
            else:
                self._subscribed_known = True
                self._subscribed = {
                    (name, partition)
                    for name, topic in metadata.topics.items()
                    if topic.error is None and self._subscribes_to(name)
                    for partition in topic.partitions
                }
        return frozenset(self._subscribed - self._assigned)

    def _warn_missing_topic(self, topic: str) -> None:
        """A subscribed topic the cluster does not have: waited for (Debezium creates a table's topic with its
        first change), but a mistyped name would wait for ever, so the warning names the cluster's topics closest
        to it. Once per topic and process."""
        if topic in self._missing_warned:
            return
        self._missing_warned.add(topic)
        assert self._consumer is not None
        try:
            names = [name for name in self._consumer.list_topics(timeout=5.0).topics if not name.startswith("__")]
        except KafkaException:
            names = []
        close = difflib.get_close_matches(topic, names, n=3, cutoff=0.8)
        log.warning(
            "kafka: subscribed topic %r does not exist (yet: Debezium creates a table's topic with its first change)%s",
            topic,
            f"; did you mean {' or '.join(repr(name) for name in close)}?" if close else "",
            extra={"topic": topic},
        )

    def _subscribes_to(self, topic: str) -> bool:
        return self._selection.follows(topic)

    def commit_advisory(self, offsets: Mapping[tuple[str, int], int]) -> None:
        if self._consumer is None or not offsets:
            return
        mine = [TopicPartition(t, p, o) for (t, p), o in offsets.items() if (t, p) in self._assigned]
        if not mine:
            return
        try:
            self._consumer.commit(offsets=mine, asynchronous=True)
        except KafkaException as exc:  # advisory: never fail the flush for it
            log.debug("advisory offset commit failed: %s", exc)

    def lag(self) -> dict[tuple[str, int], int]:
        if self._consumer is None:
            return {}
        lags: dict[tuple[str, int], int] = {}
        for tp, position in self._positions.items():
            try:
                _low, high = self._consumer.get_watermark_offsets(TopicPartition(*tp), cached=True)
            except KafkaException:
                continue
            if high is not None and high >= 0:
                lags[tp] = max(high - position, 0)
        return lags


def _partition_list(partitions: frozenset[tuple[str, int]], shown: int = 6) -> str:
    return first_few([f"{topic}[{partition}]" for topic, partition in sorted(partitions)], shown)
