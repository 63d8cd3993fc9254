"""Real dbt on real Spark and Iceberg for silver tests: bronze via the ingest pipeline, silver via `dbt build`.

Change events are Informix-shaped (ordering = commit_lsn, change_lsn; a ``Topic`` can be PostgreSQL's) with
schemas enabled. A plain-Python
reference model says what silver must hold: per key the latest change over everything landed so far
(``Topic.expected``), or every version of each key for ``history='scd2'`` (``Topic.expected_history``).
MongoDB-shaped events (``MongoTopic``) test the folding of partial updates into documents.
"""

from __future__ import annotations

import itertools
import os
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import orjson
import yaml
from hypothesis import HealthCheck, Phase, settings

from ingest.bronze.naming import bronze_table_name
from ingest.bronze.tables import BronzeTables
from ingest.config import IngestSettings, Settings
from ingest.dbt_runner import run_dbt
from ingest.fakes.txmeta import TxMetaStyle, block
from ingest.lakehouse import PROJECT_ROOT, load_catalog
from ingest.pipeline import Pipeline
from ingest.scaffold import History, model_yaml, scaffold
from ingest.sources.file import FileSource

ROW_FIELDS = [
    {"type": "int32", "optional": False, "field": "id"},
    {"type": "string", "optional": True, "field": "v"},
    {"type": "int64", "optional": True, "field": "n"},
]
KEY_SCHEMA = {"type": "struct", "optional": False, "name": "ifx.s.t.Key", "fields": [ROW_FIELDS[0]]}
SOURCE_FIELDS = [
    {"type": "string", "optional": False, "field": "connector"},
    {"type": "int64", "optional": False, "field": "ts_ms"},
    {"type": "string", "optional": True, "field": "commit_lsn"},
    {"type": "string", "optional": True, "field": "change_lsn"},
]
POSTGRESQL_SOURCE_FIELDS = [
    *SOURCE_FIELDS[:2],
    {"type": "int64", "optional": True, "field": "lsn"},
    {"type": "string", "optional": True, "field": "sequence"},
]

# How silver breaks ties on equal positions (reference.md §7, docs/silver.md; written out here, not taken from the
# code under test): a snapshot read is older than a change at the same position, a delete newer than an update, a
# truncate last.
OP_RANK = {"r": 0, "c": 1, "u": 2, "d": 3, "t": 4}
# The connectors whose source blocks a Topic writes (Topic.source).
Connector = Literal["informix", "postgresql"]
# PostgreSQL transaction ids end in a log position, an END's after its changes': theirs stay below this one.
END_LSN = 1_000_000


def envelope_schema(name: str, source_fields: list[dict[str, Any]] = SOURCE_FIELDS) -> dict[str, Any]:
    row = {"type": "struct", "optional": True, "name": f"{name}.Value", "fields": ROW_FIELDS}
    return {
        "type": "struct",
        "optional": False,
        "name": f"{name}.Envelope",
        "fields": [
            {**row, "field": "before"},
            {**row, "field": "after"},
            {"type": "struct", "optional": False, "field": "source", "fields": source_fields},
            {"type": "string", "optional": False, "field": "op"},
            {"type": "int64", "optional": True, "field": "ts_ms"},
        ],
    }


@dataclass(frozen=True)
class Change:
    """One change to key ``id`` at position ``lsn`` (op c/u/d/r/t); ``v`` is the new value.

    ``n`` is the image's other column: the position by default, or a value (None: not carried, as an update under
    Oracle PK-only supplemental logging leaves the columns it did not change). A primary-key change is a delete
    with ``new_key`` and a create with ``old_key`` at one position, which get Debezium's `__debezium.newkey` and
    `__debezium.oldkey` headers (``oldkey_header``: that header's text instead of the default converter's form).
    """

    op: str
    id: int
    lsn: int
    v: str | None = None
    tombstone: bool = True  # a delete is followed by a tombstone, as Debezium does by default
    n: int | Literal["lsn"] | None = "lsn"
    old_key: int | None = None
    new_key: int | None = None
    oldkey_header: str | None = None

    @property
    def n_value(self) -> int | None:
        return self.lsn if self.n == "lsn" else self.n

    def position(self, offset: int) -> tuple[tuple[int, int], int, int]:
        return ((self.lsn, self.lsn), OP_RANK[self.op], offset)


@dataclass
class Topic:
    """A test topic: records get consecutive offsets; ``landed`` keeps (change, offset) for the reference.
    ``connector``: Informix's source block (with transaction blocks, a change's place in its transaction ends its
    position), or PostgreSQL's (``sequence``: a primary-key change's delete and create share one position)."""

    name: str
    next_offset: int = 0
    landed: list[tuple[Change, int]] = field(default_factory=list)
    connector: Connector = "informix"

    def source(self, change: Change) -> dict[str, Any]:
        """The change's source block (the reference's positions, ``Change.position``, fit both connectors)."""
        ts_ms = 1_700_000_000_000 + change.lsn
        if self.connector == "postgresql":
            lsn = str(change.lsn)
            return {"connector": "postgresql", "ts_ms": ts_ms, "lsn": change.lsn, "sequence": f'["{lsn}","{lsn}"]'}
        return {"connector": "informix", "ts_ms": ts_ms, "commit_lsn": str(change.lsn), "change_lsn": str(change.lsn)}

    @property
    def table(self) -> str:
        return self.name.replace(".", "_")

    def records(self, changes: list[Change]) -> list[dict[str, Any]]:
        fields = POSTGRESQL_SOURCE_FIELDS if self.connector == "postgresql" else SOURCE_FIELDS
        schema = envelope_schema(self.name, fields)
        lines = []
        for change in changes:
            image = (
                None
                if change.v is None and change.op in "dt"
                else {"id": change.id, "v": change.v, "n": change.n_value}
            )
            before = {"id": change.id, "v": None, "n": None} if change.op in "ud" else None
            payload = {
                "before": before,
                "after": None if change.op in "dt" else image,
                "source": self.source(change),
                "op": change.op,
                "ts_ms": 1_700_000_000_000 + change.lsn,
            }
            key = None if change.op == "t" else {"schema": KEY_SCHEMA, "payload": {"id": change.id}}
            headers = []  # kcat's form; the key as Kafka Connect's default header converter writes a struct
            if change.old_key is not None:
                headers = ["__debezium.oldkey", change.oldkey_header or orjson.dumps({"id": change.old_key}).decode()]
            if change.new_key is not None:
                headers = ["__debezium.newkey", orjson.dumps({"id": change.new_key}).decode()]
            lines.append(self._line(key, {"schema": schema, "payload": payload}, headers))
            self.landed.append((change, self.next_offset - 1))
            if change.op == "d" and change.tombstone:
                lines.append(self._line(key, None, headers))
        return lines

    def _line(self, key: Any, value: Any, headers: list[str] | None = None) -> dict[str, Any]:
        line = {
            "topic": self.name,
            "partition": 0,
            "offset": self.next_offset,
            "ts": 1_700_000_000_000,
            "key": None if key is None else orjson.dumps(key).decode(),
            "payload": None if value is None else orjson.dumps(value).decode(),
        }
        if headers:
            line["headers"] = headers
        self.next_offset += 1
        return line

    def unvoided(self) -> list[tuple[Any, Change]]:
        """Every landed change but truncates and the changes older than the latest truncate, with its position."""
        truncates = [c.position(o) for c, o in self.landed if c.op == "t"]
        cutoff = max(truncates) if truncates else None
        positioned = [(change.position(offset), change) for change, offset in self.landed if change.op != "t"]
        return [(position, change) for position, change in positioned if cutoff is None or position > cutoff]

    def expected(self) -> dict[int, str | None]:
        """Reference model: per key the latest change over everything landed; a truncate voids older ones."""
        return {key: change.v for key, change in _latest(self.unvoided()).items() if change.op != "d"}

    def expected_deleted(self) -> dict[int, str | None]:
        """Reference model for delete_mode='soft': the keys whose latest change is a delete, each with the value of
        its latest change that is not a delete (None: it has none). A truncate voids older changes here too."""
        unvoided = self.unvoided()
        values = _latest([(position, change) for position, change in unvoided if change.op != "d"])
        return {
            key: values[key].v if key in values else None
            for key, change in _latest(unvoided).items()
            if change.op == "d"
        }

    def expected_history(self, soft: bool = False) -> list[Version]:
        """Reference model for history='scd2': every version of each key over everything landed.

        Versions are ordered by (position, op rank, offset). A replay (the key's event just before it has the same
        position, op and image) counts once, at its first offset; A, B, A at one position are three versions.
        Each is valid until the key's next event. A truncate ends the versions open at it. Deletes and truncates
        are rows of their own (markers) only with soft deletes.
        """
        truncates: dict[int, int] = {}
        for change, offset in self.landed:
            if change.op == "t":
                truncates[change.lsn] = min(offset, truncates.get(change.lsn, offset))
        landed: dict[int, list[tuple[tuple[int, int, int], str, str | None]]] = {}
        for change, offset in self.landed:
            if change.op != "t":
                landed.setdefault(change.id, []).append(((change.lsn, OP_RANK[change.op], offset), change.op, change.v))
        events: dict[int, list[tuple[tuple[int, int, int], str, str | None]]] = {}
        for key, all_events in landed.items():
            all_events.sort()
            events[key] = [
                event
                for index, event in enumerate(all_events)
                if index == 0 or (all_events[index - 1][0][:2], all_events[index - 1][1:]) != (event[0][:2], event[1:])
            ]
        rows: list[Version] = []
        for key, history in events.items():
            for lsn, offset in sorted(truncates.items()):
                position = (lsn, OP_RANK["t"], offset)
                before = [event for event in history if event[0] < position]
                if before and before[-1][1] in "cur":
                    history.insert(len(before), (position, "t", None))
            for index, (position, op, v) in enumerate(history):
                following = history[index + 1] if index + 1 < len(history) else None
                if op in "dt" and not soft:
                    continue
                valid_to = following[0][0] if following else None
                rows.append(
                    Version(key, position[0], position[2], op, None if op in "dt" else v, valid_to, following is None)
                )
        return sorted(rows)


def _latest(changes: list[tuple[Any, Change]]) -> dict[int, Change]:
    """Per key, its change with the greatest position."""
    latest: dict[int, tuple[Any, Change]] = {}
    for position, change in changes:
        if change.id not in latest or position > latest[change.id][0]:
            latest[change.id] = (position, change)
    return {key: change for key, (_, change) in latest.items()}


@dataclass(frozen=True, order=True)
class Version:
    """One history row as the tests compare it (positions as the Informix LSN the harness writes)."""

    id: int
    valid_from: int
    offset: int
    op: str
    v: str | None
    valid_to: int | None
    is_current: bool


MONGO_KEY_SCHEMA = {
    "type": "struct",
    "optional": False,
    "fields": [{"type": "string", "optional": False, "field": "id"}],
}
_JSON_TEXT = {"type": "string", "optional": True, "name": "io.debezium.data.Json", "version": 1}
MONGO_ENVELOPE_SCHEMA = {
    "type": "struct",
    "optional": False,
    "fields": [
        {**_JSON_TEXT, "field": "before"},
        {**_JSON_TEXT, "field": "after"},
        {**_JSON_TEXT, "field": "patch"},
        {**_JSON_TEXT, "field": "filter"},
        {
            "type": "struct",
            "optional": True,
            "field": "updateDescription",
            "fields": [
                {
                    "type": "array",
                    "items": {"type": "string", "optional": False},
                    "optional": True,
                    "field": "removedFields",
                },
                {**_JSON_TEXT, "field": "updatedFields"},
                {
                    "type": "array",
                    "optional": True,
                    "field": "truncatedArrays",
                    "items": {
                        "type": "struct",
                        "optional": False,
                        "fields": [
                            {"type": "string", "optional": False, "field": "field"},
                            {"type": "int32", "optional": False, "field": "size"},
                        ],
                    },
                },
            ],
        },
        {
            "type": "struct",
            "optional": False,
            "field": "source",
            "fields": [
                {"type": "string", "optional": False, "field": "connector"},
                {"type": "string", "optional": False, "field": "rs"},
                {"type": "int64", "optional": False, "field": "ts_ms"},
                {"type": "int32", "optional": False, "field": "ord"},
            ],
        },
        {"type": "string", "optional": True, "field": "op"},
        {"type": "int64", "optional": True, "field": "ts_ms"},
        TxMetaStyle(v2=False).block_schema(),
    ],
}


@dataclass(frozen=True)
class MongoChange:
    """A MongoDB change event of document ``_id`` = ``id`` at cluster time (``sec``, ``ord``).

    ``after`` is the full document (c, r, or an update in change_streams_update_full mode); an update without it
    carries ``updated`` (updatedFields), ``removed`` and ``truncated`` (updateDescription), or an oplog ``patch``.
    ``place`` is the event's ``transaction.total_order`` in a multi-document transaction (None: not in one).
    """

    op: str
    id: int
    sec: int
    ord: int = 1
    after: dict[str, Any] | None = None
    updated: dict[str, Any] | None = None
    removed: list[str] | None = None
    truncated: list[tuple[str, int]] | None = None
    patch: dict[str, Any] | None = None
    place: int | None = None
    after_text: str | None = None  # ``after`` as this very text (e.g. with a bare NaN, which is not JSON)
    before: dict[str, Any] | None = None  # the pre-image (capture.mode change_streams_with_pre_image)

    def payload(self) -> dict[str, Any]:
        description = None
        if self.updated is not None or self.removed is not None or self.truncated is not None:
            description = {
                "removedFields": self.removed,
                "updatedFields": None if self.updated is None else orjson.dumps(self.updated).decode(),
                "truncatedArrays": None
                if self.truncated is None
                else [{"field": name, "size": size} for name, size in self.truncated],
            }
        return {
            "before": None if self.before is None else orjson.dumps(self.before).decode(),
            "after": self.after_text if self.after is None else orjson.dumps(self.after).decode(),
            "patch": None if self.patch is None else orjson.dumps(self.patch).decode(),
            "filter": None,
            "updateDescription": description,
            "source": {"connector": "mongodb", "rs": "rs0", "ts_ms": self.sec * 1000, "ord": self.ord},
            "op": self.op,
            "ts_ms": self.sec * 1000 + 5,
            "transaction": None if self.place is None else block(f"tx{self.sec}.{self.ord}", self.place, self.place),
        }


@dataclass
class MongoTopic:
    """A MongoDB test topic (typed envelopes, or schemaless ones with ``schemas=False``)."""

    name: str
    schemas: bool = True
    next_offset: int = 0

    @property
    def table(self) -> str:
        return self.name.replace(".", "_")

    def records(self, changes: list[MongoChange]) -> list[dict[str, Any]]:
        lines = []
        for change in changes:
            key: dict[str, Any] = {"id": str(change.id)}
            value: dict[str, Any] | None = change.payload()
            if self.schemas:
                key = {"schema": MONGO_KEY_SCHEMA, "payload": key}
                value = {"schema": MONGO_ENVELOPE_SCHEMA, "payload": value}
            for payload in [value, None] if change.op == "d" else [value]:
                lines.append(
                    {
                        "topic": self.name,
                        "partition": 0,
                        "offset": self.next_offset,
                        "ts": 1_700_000_000_000,
                        "key": orjson.dumps(key).decode(),
                        "payload": None if payload is None else orjson.dumps(payload).decode(),
                    }
                )
                self.next_offset += 1
        return lines


def without_schema(text: str | None) -> str | None:
    """A JSON-converter key or value as it is with `schemas.enable=false`: the envelope's payload alone."""
    return None if text is None else orjson.dumps(orjson.loads(text)["payload"]).decode()


class SilverHarness:
    _ids = itertools.count()

    def __init__(self, settings: Settings, project: Path) -> None:
        self.settings = settings
        self.project = project
        self.spark: Any = None

    @classmethod
    def create(cls, settings: Settings, root: Path) -> SilverHarness:
        project = root / "dbt_project"
        # The reference project's settings and macros, without its models (those belong to the demo's tables).
        ignore = shutil.ignore_patterns("target", "dbt_packages", "logs", "package-lock.yml", "*.sql", "*.yml")
        shutil.copytree(PROJECT_ROOT / "dbt_project", project, ignore=ignore)
        shutil.copy(PROJECT_ROOT / "dbt_project" / "dbt_project.yml", project / "dbt_project.yml")
        (project / "packages.yml").write_text(f"packages:\n  - local: {PROJECT_ROOT / 'dbt_cdclake'}\n")
        settings = settings.model_copy(update={"dbt": settings.dbt.model_copy(update={"project_dir": str(project)})})
        return cls(settings, project)

    def topic(self, stem: str, connector: Connector = "informix") -> Topic:
        return Topic(f"ifx.t{next(self._ids)}.{stem}", connector=connector)

    def mongo_topic(self, stem: str, schemas: bool = True) -> MongoTopic:
        return MongoTopic(f"mongo.t{next(self._ids)}.{stem}", schemas)

    def land(self, topic: Topic | MongoTopic, changes: list[Any], dump_dir: Path) -> None:
        self.land_lines(f"{topic.table}-{topic.next_offset}", topic.records(changes), dump_dir)

    def land_part_keyed(self, topic: Topic, changes: list[tuple[Change, str | None]], dump_dir: Path) -> None:
        """Changes whose Debezium key is (id, part), part a nullable string: a table without a primary key, keyed
        by its columns. Each change comes with its key's part."""
        key_schema = {
            "type": "struct",
            "optional": False,
            "name": f"{topic.name}.Key",
            "fields": [
                {"type": "int32", "optional": False, "field": "id"},
                {"type": "string", "optional": True, "field": "part"},
            ],
        }
        lines = []
        for change, part in changes:
            for line in topic.records([change]):
                line["key"] = orjson.dumps({"schema": key_schema, "payload": {"id": change.id, "part": part}}).decode()
                lines.append(line)
        self.land_lines(f"{topic.table}-{topic.next_offset}", lines, dump_dir)

    def land_lines(
        self, name: str, lines: list[dict[str, Any]], dump_dir: Path, ingest: IngestSettings | None = None
    ) -> None:
        path = dump_dir / f"{name}.jsonl"
        path.write_bytes(b"\n".join(orjson.dumps(line) for line in lines) + b"\n")
        tables = BronzeTables(load_catalog(self.settings), self.settings.lakehouse.bronze_namespace)
        Pipeline(ingest or self.settings.ingest, tables, FileSource(path)).run(once=True)

    def write_model(self, topic: Topic | MongoTopic, config: str = "", name: str | None = None) -> None:
        """The model ``name`` (default: the topic's table) over the topic's bronze table."""
        models = self.project / "models" / "silver"
        (models / f"{name or topic.table}.sql").write_text(
            f"{{{{ config(materialized='cdc_silver'{', ' + config if config else ''}) }}}}\n"
            f"select * from {{{{ source('bronze', '{topic.table}') }}}}\n"
        )
        # The bronze tables the models read (a model may be named other than its table).
        sources = sorted(
            {t for p in models.glob("*.sql") for t in re.findall(r"source\('bronze', '([^']+)'\)", p.read_text())}
        )
        (models / "_test_sources.yml").write_text(
            "version: 2\nsources:\n  - name: bronze\n    schema: bronze\n    tables:\n"
            + "".join(f"      - name: {table}\n" for table in sources)
        )

    def write_tests(self, topic: Topic, name: str | None = None, history: History = "current") -> None:
        """The YAML `cdclake scaffold` writes (the shipped tests, keyed on ``id``) for the model ``name`` (default:
        the topic's table) over the topic's bronze table: `dbt build` then runs them."""
        described = model_yaml(topic.table, ["id"], "bronze", None, history)
        described["models"][0]["name"] = name or topic.table
        (self.project / "models" / "silver" / f"{name or topic.table}.yml").write_text(yaml.safe_dump(described))

    def apply(self, topic: Topic | MongoTopic, changes: list[Any], dump_dir: Path, config: str = "") -> None:
        """Land ``changes``, write the topic's model with ``config`` and `dbt build` it (which must succeed)."""
        self.land(topic, changes, dump_dir)
        self.write_model(topic, config)
        assert self.build(topic), "dbt build failed"

    def build(self, topic: Topic | MongoTopic, *extra: str) -> bool:
        return run_dbt(self.settings, ["build", "--select", topic.table, *extra])

    def has_silver(self, topic: Topic | MongoTopic) -> bool:
        """Whether the topic's model has built silver (not while its bronze table holds only truncates)."""
        return bool(self.spark.sql(f"show tables in silver like '{topic.table}'").collect())

    def silver(self, topic: Topic, where: str = "true") -> dict[int, str | None]:
        if not self.has_silver(topic):
            return {}
        rows = self.spark.sql(f"select id, v from silver.{topic.table} where {where}").collect()
        ids = [row["id"] for row in rows]
        assert len(ids) == len(set(ids)), f"duplicate keys in silver.{topic.table}: {sorted(ids)}"
        return {row["id"]: row["v"] for row in rows}

    def history(self, topic: Topic) -> list[Version]:
        if not self.has_silver(topic):
            return []
        rows = self.spark.sql(
            f"select id, v, _cdc_valid_from[0] as valid_from, _cdc_valid_to[0] as valid_to, _cdc_is_current,"
            f" _cdc_op, _cdc_offset from silver.{topic.table}"
        ).collect()
        return sorted(
            Version(
                r["id"], r["valid_from"], r["_cdc_offset"], r["_cdc_op"], r["v"], r["valid_to"], r["_cdc_is_current"]
            )
            for r in rows
        )

    def rows(self, table: str, columns: str = "*", order: str = "1", where: str = "true") -> list[dict[str, Any]]:
        query = f"select {columns} from {table} where {where} order by {order}"
        return [row.asDict() for row in self.spark.sql(query).collect()]

    def documents(self, topic: MongoTopic) -> dict[str, Any]:
        """Silver's documents by key (parsed JSON)."""
        if not self.has_silver(topic):
            return {}
        rows = self.spark.sql(f"select id, _cdc_document from silver.{topic.table}").collect()
        return {row["id"]: orjson.loads(row["_cdc_document"]) for row in rows}

    def silver_snapshot(self, topic: Topic) -> int:
        table = load_catalog(self.settings).load_table(f"silver.{topic.table}")
        return int(table.current_snapshot().snapshot_id)


# `make explore`: EXPLORE_FACTOR times the examples, drawn at random, to look for what the suite's fixed ones miss.
EXPLORE_FACTOR = int(os.environ.get("CDCLAKE_EXPLORE") or 0)


def dbt_examples(count: int) -> settings:
    """Hypothesis settings for examples that each run dbt a few times: few examples, derandomized, and no
    shrinking (it would run dbt hundreds of times). With CDCLAKE_EXPLORE=N: N times as many, at random, and a
    failure prints the blob that replays it (``@reproduce_failure``)."""
    return settings(
        max_examples=count * max(EXPLORE_FACTOR, 1),
        deadline=None,
        suppress_health_check=list(HealthCheck),
        derandomize=not EXPLORE_FACTOR,
        print_blob=bool(EXPLORE_FACTOR),
        phases=[Phase.explicit, Phase.generate],
    )


def with_replay(landed: list[Change], changes: list[Change], replay: bool) -> list[Change]:
    """``changes``, preceded (when ``replay``) by a replay of the first half of what ``landed`` holds; the result is
    added to ``landed``."""
    if replay and landed:
        changes = landed[: len(landed) // 2] + changes
    landed.extend(changes)
    return changes


@dataclass
class TransactedTopic:
    """A harness topic whose changes carry Debezium's `transaction` block (v2 schemas), and END records on its
    connector's transaction topic. The source block names no table: a change's data collection is the topic's last
    two parts."""

    topic: Topic
    ends: list[dict[str, Any]] = field(default_factory=list)
    style: TxMetaStyle = field(default_factory=lambda: TxMetaStyle(v2=True))

    @property
    def transaction_table(self) -> str:
        return bronze_table_name(self.topic.name.rsplit(".", 1)[0] + ".transaction")

    def changes(self, changes: list[Change], blocks: list[tuple[str, int]]) -> list[dict[str, Any]]:
        """The records of ``changes``, each in transaction ``blocks[i]`` = (id, its data_collection_order)."""
        lines = self.topic.records(changes)
        values = [line for line in lines if line["payload"] is not None]
        for line, change, (tx_id, order) in zip(values, changes, blocks, strict=True):
            value = orjson.loads(line["payload"])
            value["schema"]["fields"].append(self.style.block_schema())
            value["payload"]["transaction"] = block(self.transaction_id(tx_id, change.lsn), order, order)
            line["payload"] = orjson.dumps(value).decode()
        return lines

    def transaction_id(self, tx_id: str, lsn: int) -> str:
        """``tx_id`` as the topic's connector writes it: PostgreSQL's ends in a log position (`734:22088504`, after
        which its END comes: its transaction numbers wrap around)."""
        if self.topic.connector != "postgresql":
            return tx_id
        assert lsn <= END_LSN, f"position {lsn} after its END's ({END_LSN})"
        return f"{tx_id}:{lsn}"

    def end(self, tx_id: str, count: int = 1) -> dict[str, Any]:
        """Transaction ``tx_id``'s END record: ``count`` changes of the topic's table."""
        collection = ".".join(self.topic.name.split(".")[-2:])
        tx_id = self.transaction_id(tx_id, END_LSN)
        line = {
            "topic": self.topic.name.rsplit(".", 1)[0] + ".transaction",
            "partition": 0,
            "offset": len(self.ends),
            "ts": 1_700_000_000_000,
            "key": self.style.key(tx_id).decode(),
            "payload": self.style.end(tx_id, 1_700_000_000_000, [(collection, count)]).decode(),
        }
        self.ends.append(line)
        return line

    def options(self, config: str) -> str:
        """The model's config options: ``complete_transactions`` and ``config``."""
        return f"complete_transactions='{self.transaction_table}'" + (f", {config}" if config else "")

    def scaffold(self, harness: SilverHarness, config: str, where: str | None = None) -> None:
        """The topic's model and its shipped tests, with ``complete_transactions`` and ``config``; with ``where``, a
        model of the rows it keeps, tested with it as ``bronze_where``."""
        tables = BronzeTables(load_catalog(harness.settings), harness.settings.lakehouse.bronze_namespace)
        scaffold(tables, harness.project, select=self.topic.table)
        model = harness.project / "models" / "silver" / f"{self.topic.table}.sql"
        model.write_text(
            model.read_text().replace(") }}", f", {self.options(config)}) }}}}", 1)
            + (f"\nwhere {where}\n" if where else "")
        )
        if where:
            described = model.with_suffix(".yml")
            yml = yaml.safe_load(described.read_text())
            for test in yml["models"][0]["data_tests"]:
                arguments = next(iter(test.values()))["arguments"]
                if "bronze" in arguments:
                    arguments["bronze_where"] = where
            described.write_text(yaml.safe_dump(yml))
