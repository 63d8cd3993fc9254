"""Faithful fakes of the Debezium Db2, Informix, Oracle and MongoDB connectors (JSON converter, schemas on).

No such database can run here, so these emit what the real connectors put on Kafka (per the seeds, reference
§1-§5): change events with their Connect schemas, tombstones, transaction metadata and Kafka partitioning.
"""

from ingest.fakes.records import KafkaRecord, to_kcat_json, write_kcat_jsonl
from ingest.fakes.scenario import SOURCES, FakeStream, build_stream, continue_stream

__all__ = [
    "SOURCES",
    "FakeStream",
    "KafkaRecord",
    "build_stream",
    "continue_stream",
    "to_kcat_json",
    "write_kcat_jsonl",
]
