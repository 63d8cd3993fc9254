"""Real dbt on real Spark and Iceberg for silver tests: bronze via the ingest pipeline, silver via `dbt build`.

Change events are Informix-shaped (ordering = commit_lsn, change_lsn) with schemas enabled. A plain-Python
reference model says what silver must hold: per key the latest change over everything landed so far.
"""

from __future__ import annotations

import itertools
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from ingest.bronze.tables import BronzeTables
from ingest.config import Settings
from ingest.dbt_runner import run_dbt
from ingest.debezium.ordering import OP_RANK
from ingest.lakehouse import PROJECT_ROOT, load_catalog
from ingest.pipeline import Pipeline
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


def envelope_schema(name: str) -> dict[str, Any]:
    row = {"type": "struct", "optional": True, "name": f"{name}.Value", "fields": ROW_FIELDS}
    return {
        "type": "struct",
        "optional": False,
        "name": f"{name}.Envelope",
        "fields": [
            {**row, "field": "before"},
            {**row, "field": "after"},
            {"type": "struct", "optional": False, "field": "source", "fields": SOURCE_FIELDS},
            {"type": "string", "optional": False, "field": "op"},
            {"type": "int64", "optional": True, "field": "ts_ms"},
        ],
    }


@dataclass(frozen=True)
class Change:
    """One change to key ``id`` at position ``lsn`` (op c/u/d/r/t); ``v`` is the new value."""

    op: str
    id: int
    lsn: int
    v: str | None = None
    tombstone: bool = True  # a delete is followed by a tombstone, as Debezium does by default

    def position(self, offset: int) -> tuple[tuple[int, int], int, int]:
        return ((self.lsn, self.lsn), OP_RANK[self.op], offset)


@dataclass
class Topic:
    """A test topic: records get consecutive offsets; ``landed`` keeps (change, offset) for the reference."""

    name: str
    next_offset: int = 0
    landed: list[tuple[Change, int]] = field(default_factory=list)

    @property
    def table(self) -> str:
        return self.name.replace(".", "_")

    def records(self, changes: list[Change]) -> list[dict[str, Any]]:
        schema = envelope_schema(self.name)
        lines = []
        for change in changes:
            image = (
                None if change.v is None and change.op in "dt" else {"id": change.id, "v": change.v, "n": change.lsn}
            )
            before = {"id": change.id, "v": None, "n": None} if change.op in "ud" else None
            payload = {
                "before": before,
                "after": None if change.op in "dt" else image,
                "source": {
                    "connector": "informix",
                    "ts_ms": 1_700_000_000_000 + change.lsn,
                    "commit_lsn": str(change.lsn),
                    "change_lsn": str(change.lsn),
                },
                "op": change.op,
                "ts_ms": 1_700_000_000_000 + change.lsn,
            }
            key = None if change.op == "t" else {"schema": KEY_SCHEMA, "payload": {"id": change.id}}
            lines.append(self._line(key, {"schema": schema, "payload": payload}))
            self.landed.append((change, self.next_offset - 1))
            if change.op == "d" and change.tombstone:
                lines.append(self._line(key, None))
        return lines

    def _line(self, key: Any, value: Any) -> dict[str, Any]:
        line = {
            "topic": self.name,
            "partition": 0,
            "offset": self.next_offset,
            "ts": 1_700_000_000_000,
            "key": None if key is None else orjson.dumps(key).decode(),
            "payload": None if value is None else orjson.dumps(value).decode(),
        }
        self.next_offset += 1
        return line

    def expected(self) -> dict[int, str | None]:
        """Reference model: per key the latest change over everything landed; a truncate voids older ones."""
        truncates = [c.position(o) for c, o in self.landed if c.op == "t"]
        cutoff = max(truncates) if truncates else None
        latest: dict[int, tuple[Any, Change]] = {}
        for change, offset in self.landed:
            position = change.position(offset)
            if change.op == "t" or (cutoff is not None and position < cutoff):
                continue
            if change.id not in latest or position > latest[change.id][0]:
                latest[change.id] = (position, change)
        return {key: change.v for key, (_, change) in latest.items() if change.op != "d"}


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

    def topic(self, stem: str) -> Topic:
        return Topic(f"ifx.t{next(self._ids)}.{stem}")

    def land(self, topic: Topic, changes: list[Change], dump_dir: Path) -> None:
        path = dump_dir / f"{topic.table}-{topic.next_offset}.jsonl"
        path.write_bytes(b"\n".join(orjson.dumps(line) for line in topic.records(changes)) + b"\n")
        tables = BronzeTables(load_catalog(self.settings), self.settings.lakehouse.bronze_namespace)
        Pipeline(self.settings.ingest, tables, FileSource(path)).run(once=True)

    def write_model(self, topic: Topic, config: str = "") -> None:
        models = self.project / "models" / "silver"
        (models / f"{topic.table}.sql").write_text(
            f"{{{{ config(materialized='cdc_silver'{', ' + config if config else ''}) }}}}\n"
            f"select * from {{{{ source('bronze', '{topic.table}') }}}}\n"
        )
        sources = sorted(p.stem for p in models.glob("*.sql"))
        (models / "_test_sources.yml").write_text(
            "version: 2\nsources:\n  - name: bronze\n    schema: bronze\n    tables:\n"
            + "".join(f"      - name: {name}\n" for name in sources)
        )

    def build(self, topic: Topic, *extra: str) -> bool:
        return run_dbt(self.settings, ["build", "--select", topic.table, *extra])

    def silver(self, topic: Topic, where: str = "true") -> dict[int, str | None]:
        rows = self.spark.sql(f"select id, v from silver.{topic.table} where {where}").collect()
        ids = [row["id"] for row in rows]
        assert len(ids) == len(set(ids)), f"duplicate keys in silver.{topic.table}: {sorted(ids)}"
        return {row["id"]: row["v"] for row in rows}

    def silver_snapshot(self, topic: Topic) -> int:
        table = load_catalog(self.settings).load_table(f"silver.{topic.table}")
        return int(table.current_snapshot().snapshot_id)
