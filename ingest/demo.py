"""`cdclake demo`: the whole pipeline on embedded defaults, checked against the generator's expected state.

Broker (Tansu on loopback) -> Debezium streams of a Db2 table, an Informix table, an Oracle table and a MongoDB
collection (faithful fakes of the connectors' envelopes) -> `cdclake ingest --once` -> `cdclake scaffold` ->
`dbt build` -> silver printed and compared with what the source tables hold after the same changes.

Each run regenerates the same streams (plus ``rounds`` continuations) on a fresh broker; bronze's offsets make
the already-landed records no-ops, so a re-run shows exactly-once resume and `--more` shows incremental apply.
"""

from __future__ import annotations

import datetime as dt
import decimal
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import yaml
from rich.console import Console
from rich.table import Table

from ingest.config import Settings, load_settings
from ingest.fakes import SOURCES, build_stream, continue_stream
from ingest.fakes.scenario import FakeStream

STATE_FILE = "demo-state.json"
DEMO_SEED = 7


@dataclass
class SourceCheck:
    source: str
    table: str
    expected_rows: int
    silver_rows: int
    mismatches: list[str]


def streams(rounds: int) -> list[FakeStream]:
    result = []
    for source in SOURCES:
        stream = build_stream(source, seed=DEMO_SEED, n_keys=12, n_changes=60, partitions=2)
        for _ in range(rounds):
            stream = continue_stream(stream, 25)
        result.append(stream)
    return result


def demo_settings(root: Path, bootstrap: str, topics: list[str], project_dir: Path) -> Settings:
    """The demo's settings, also written to ``root/cdclake-demo.yml`` for the commands it suggests next (every one
    of them, `cdclake dbt` and `scaffold` included, reads the same lakehouse and dbt project).

    Its driver runs the shipped Spark settings with the JIT of short runs (SHORT_RUN_JIT_OPTIONS): its builds are
    a few hundred changes. The demo and `--more` (tests/test_demo.py) then took 65-69 s of CPU in 64-67 s,
    against 107-112 s of CPU in 72-75 s with the JDK's default JIT (measured 2026-12-06, two runs each)."""
    from ingest.lakehouse import EMBEDDED_SPARK_CONF, read_spark_defaults
    from ingest.spark import SHORT_RUN_JIT_OPTIONS

    root.mkdir(parents=True, exist_ok=True)
    shipped = read_spark_defaults(EMBEDDED_SPARK_CONF).get("spark.driver.extraJavaOptions", "")
    config = {
        "lakehouse": {"warehouse": str(root / "warehouse"), "catalog_uri": f"sqlite:///{root / 'catalog.db'}"},
        "source": {"type": "kafka", "bootstrap_servers": bootstrap, "topics": topics, "group_id": "cdclake-demo"},
        "ingest": {"latency_threshold_s": 2.0},
        "dbt": {"project_dir": str(project_dir)},
        "spark": {"conf": {"spark.driver.extraJavaOptions": f"{shipped} {SHORT_RUN_JIT_OPTIONS}".strip()}},
    }
    path = root / "cdclake-demo.yml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return load_settings(path, environ={})


def _normalize(value: Any) -> Any:
    if isinstance(value, dt.datetime) and value.tzinfo is not None:
        return value.astimezone(dt.UTC).replace(tzinfo=None)
    if isinstance(value, decimal.Decimal):
        return value.normalize()
    return value


def check_source(spark: Any, stream: FakeStream, table: str, silver_ns: str) -> SourceCheck:
    """Silver must hold exactly the generator's final state: same keys, same values."""
    rows = [row.asDict() for row in spark.sql(f"select * from {silver_ns}.{table}").collect()]
    return SourceCheck(stream.source, table, len(stream.expected), len(rows), source_mismatches(rows, stream))


def source_mismatches(rows: list[dict[str, Any]], stream: FakeStream) -> list[str]:
    """Silver's ``rows`` against the generator's final state: the same keys, no key twice, and column by column the
    values the generator drew for the source row (not its connector's encoding of them decoded again by cdclake,
    which would hide a decoding bug on both sides); MongoDB's documents as the connector wrote them."""
    # Keys are canonical JSON of the Debezium key (MongoDB: {"id": <extended JSON of _id>}).
    key_names = list(orjson.loads(next(iter(stream.expected), '{"id": 0}')))
    actual = {orjson.dumps({k: row[k] for k in key_names}, option=orjson.OPT_SORT_KEYS).decode(): row for row in rows}
    mismatches = [f"{len(rows) - len(actual)} duplicate key(s) in silver"] if len(actual) != len(rows) else []
    mismatches += [f"missing from silver: {key}" for key in sorted(stream.expected.keys() - actual.keys())]
    mismatches += [
        f"in silver but deleted at the source: {key}" for key in sorted(actual.keys() - stream.expected.keys())
    ]
    for key in sorted(stream.expected.keys() & actual.keys()):
        row = actual[key]
        if "_cdc_document" in row:
            if orjson.loads(row["_cdc_document"]) != stream.expected[key]:
                mismatches.append(f"{key}: document differs")
            continue
        for column, value in stream.rows[key].items():
            if _normalize(row.get(column)) != _normalize(value):
                mismatches.append(f"{key}.{column}: silver {row.get(column)!r} != source {value!r}")
    return mismatches


def run(project_root: Path, rounds_delta: int = 0, console: Console | None = None) -> bool:
    from ingest.broker import TansuBroker
    from ingest.bronze.naming import bronze_table_name
    from ingest.bronze.tables import BronzeTables
    from ingest.dbt_runner import run_dbt
    from ingest.lakehouse import load_catalog
    from ingest.pipeline import Pipeline
    from ingest.scaffold import scaffold
    from ingest.sources.kafka import KafkaSource
    from ingest.spark import spark_session

    console = console or Console()
    root = project_root / "lakehouse"
    root.mkdir(parents=True, exist_ok=True)
    state_path = root / STATE_FILE
    rounds = (orjson.loads(state_path.read_bytes())["rounds"] if state_path.exists() else 0) + rounds_delta
    fakes = streams(rounds)
    topics = sorted({record.topic for stream in fakes for record in stream.records})
    started = time.monotonic()

    with console.status("starting the embedded Kafka-protocol broker (Tansu) on loopback"), TansuBroker() as broker:
        console.print(f"[green]✓[/] broker at {broker.bootstrap_servers}")
        with console.status(f"publishing Debezium streams to {len(topics)} topics"):
            broker.create_topics(topics, partitions=2, exist_ok=True)
            records = [record for stream in fakes for record in stream.records]
            broker.produce(records)
        console.print(
            f"[green]✓[/] published {len(records)} change records (Db2, Informix, Oracle, MongoDB; round {rounds})"
        )

        settings = demo_settings(root, broker.bootstrap_servers, topics, project_root / "dbt_project")
        tables = BronzeTables(load_catalog(settings), settings.lakehouse.bronze_namespace)
        pipeline = Pipeline(settings.ingest, tables, KafkaSource(settings.require_source()))
        with console.status("cdclake ingest --once: landing change records in Iceberg bronze"):
            stats = pipeline.run(once=True)
        console.print(
            f"[green]✓[/] ingest: {stats.written} new records written, {stats.skipped} already in bronze, "
            f"{stats.dead_letters} dead letters"
        )
    state_path.write_bytes(orjson.dumps({"rounds": rounds}))

    report = scaffold(tables, project_root / "dbt_project")
    console.print(f"[green]✓[/] scaffold: {len(report.written)} file(s) written, {len(report.kept)} kept as edited")
    with console.status("starting Spark"):
        spark = spark_session(settings, app_name="cdclake-demo")
    with console.status("dbt build: net-effect apply into silver, then the generic tests"):
        ok = run_dbt(settings, ["build", "--quiet"])
    if not ok:
        console.print("[red]✗ dbt build failed[/] (see the output above)")
        return False
    console.print("[green]✓[/] dbt build: silver applied and tested")

    checks = []
    for stream in fakes:
        table = bronze_table_name(stream.data_topic)
        _print_silver(console, spark, settings, stream, table)
        checks.append(check_source(spark, stream, table, settings.lakehouse.silver_namespace))
    # Narrow enough for 80 columns (each source's silver table is named above its rows).
    summary = Table(title="silver vs. the source tables' final state (rows)")
    for column in ("source", "expected", "in silver", "changes", "last applied (UTC)", "check"):
        summary.add_column(column, no_wrap=True)
    for check, stream in zip(checks, fakes, strict=True):
        freshness = spark.sql(
            f"select max(_cdc_source_ts) as last_change, max(_cdc_applied_at) as applied from "
            f"{settings.lakehouse.silver_namespace}.{check.table}"
        ).collect()[0]
        changes = sum(1 for record in stream.records if record.topic == stream.data_topic and record.value is not None)
        lag = "n/a" if freshness["applied"] is None else f"{freshness['applied']:%Y-%m-%d %H:%M:%S}"
        summary.add_row(
            check.source,
            str(check.expected_rows),
            str(check.silver_rows),
            str(changes),
            lag,
            "[green]equal[/]" if not check.mismatches else f"[red]{len(check.mismatches)} differences[/]",
        )
    console.print(summary)
    failed = [check for check in checks if check.mismatches]
    for check in failed:
        for line in check.mismatches[:10]:
            console.print(f"[red]{check.source}:[/] {line}")
    console.print(f"finished in {time.monotonic() - started:.0f}s")
    if failed:
        return False
    console.print(
        "\n[bold]Try next:[/]\n"
        f'  cdclake --config {root / "cdclake-demo.yml"} sql "select * from silver.{checks[0].table} limit 5"\n'
        f"  cdclake --config {root / 'cdclake-demo.yml'} status\n"
        f"  cdclake --config {root / 'cdclake-demo.yml'} dbt test     # silver's data tests again\n"
        "  cdclake demo --more          # stream more changes and apply them incrementally\n",
        soft_wrap=True,  # commands stay whole lines, to copy
    )
    return True


def _print_silver(console: Console, spark: Any, settings: Settings, stream: FakeStream, table: str) -> None:
    frame = spark.sql(f"select * from {settings.lakehouse.silver_namespace}.{table} order by 1 limit 6")
    columns = [c for c in frame.columns if not c.startswith("_cdc_") or c in ("_cdc_op", "_cdc_document")]
    # As many columns as the console shows legibly (~14 characters each; 80 columns squeezed names to 4 a line).
    fits = max(console.width // 14, 3)
    hidden = max(len(columns) - fits, 0)
    if hidden:
        columns = [*columns[: fits - 1], columns[-1]]  # the key and the first columns, and _cdc_op / the document
    caption = f"{hidden} more column(s): cdclake sql shows every one" if hidden else None
    view = Table(title=f"silver.{table}  ({stream.source})", title_justify="left", caption=caption)
    for column in columns:
        view.add_column(column, overflow="fold", max_width=36)
    for row in frame.collect():
        view.add_row(*("" if row[c] is None else str(row[c]) for c in columns))
    console.print(view)
