"""Scale-out benchmark: ingest with 1, 2 and 3 processes, and `dbt build` on local Spark vs a standalone cluster.

1. Publishes N Debezium change events (the ingest benchmark's PostgreSQL-connector envelopes, schemas on) to one
   topic with 6 partitions of the embedded Tansu broker.
2. For 1, 2 and 3 processes: a fresh lakehouse (PostgreSQL catalog on a private server, or SQLite) and a fresh
   consumer group; that many `cdclake ingest --once` processes are started together and timed until the last exits.
   "steady" runs from the first partition assignment to the last bronze commit (the processes' own log stamps);
   "reading" stops at the last commit before a process, at the end of its share, waits for partitions another
   member holds (`--once`'s handover grace); "end to end" includes Python start-up and the group join.
3. On the bronze table of the 1-process run: `cdclake scaffold`, then `cdclake dbt build` three times into separate
   silver namespaces: local Spark (`local[2]`), dbt-spark's session method on a standalone cluster (master + 2
   workers, 1 core / 1g each), and dbt-spark's thrift method against a Spark Thrift Server on that cluster.

Run with ``python -m bench.scaleout_bench`` (``--events N``, ``--catalog sqlite``, ``--skip-dbt``, ``--compression
lz4`` for lz4-compressed topic batches, ``--write`` to replace the measured section of docs/scaling.md). Everything
runs on 127.0.0.1 and is stopped on exit.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time
import zlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
import yaml

from bench.ingest_bench import envelopes
from ingest.broker import Record, TansuBroker
from ingest.lakehouse import PROJECT_ROOT, RUNTIME_DIR_ENV, runtime_dir, spark_conf
from ingest.testing.postgres import PrivatePostgres
from ingest.testing.spark_cluster import SparkCluster, ThriftServer

TOPIC = "scaledb.inventory.orders"
PARTITIONS = 6
DEFAULT_EVENTS = 200_000
PROCESS_COUNTS = (1, 2, 3)
DOCS = PROJECT_ROOT / "docs" / "scaling.md"
BEGIN_MARK = "<!-- scaleout-bench:begin -->"
END_MARK = "<!-- scaleout-bench:end -->"
INGEST = {"max_records": 50_000, "latency_threshold_s": 10.0}


@dataclass
class IngestRun:
    processes: int
    events: int
    end_to_end_s: float = 0.0
    steady_s: float = 0.0
    # First assignment to the last commit before `--once` waits for partitions another member holds (the
    # handover grace, ingest.sources.kafka): the rate while every process reads its share.
    reading_s: float = 0.0
    read: int = 0
    written: int = 0
    flushes: int = 0
    per_process: list[int] = field(default_factory=list)

    def rate(self, seconds: float) -> float:
        return self.events / seconds if seconds > 0 else 0.0


@dataclass
class DbtRun:
    name: str
    wall_s: float
    models_s: float


def cdclake() -> str:
    beside = Path(sys.executable).parent / "cdclake"
    found = str(beside) if beside.is_file() else shutil.which("cdclake")
    if not found:
        raise SystemExit("the cdclake command is not installed (make setup)")
    return found


def isolated_runtime(root: Path) -> Path:
    """The project's jars and binaries, with a dbt profile and a spark-warehouse of this run's own."""
    runtime = root / "runtime"
    runtime.mkdir(parents=True, exist_ok=True)
    for name in ("jars", "bin"):
        (runtime / name).symlink_to(runtime_dir() / name)
    return runtime


def repartitioned(events: int) -> Iterator[Record]:
    for record in envelopes(events):
        partition = zlib.crc32(record.key or b"") % PARTITIONS
        yield Record(TOPIC, record.key, record.value, partition, record.timestamp_ms)


def write_config(root: Path, catalog_uri: str, bootstrap: str, group: str, **extra: Any) -> Path:
    config: dict[str, Any] = {
        "lakehouse": {"warehouse": str(root / "warehouse"), "catalog_uri": catalog_uri},
        "source": {"type": "kafka", "bootstrap_servers": bootstrap, "topics": [TOPIC], "group_id": group},
        "ingest": dict(INGEST),
        "spark": {"master": "local[2]", "driver_memory": "2g"},
    }
    for section, values in extra.items():
        config.setdefault(section, {}).update(values)
    path = root / f"cdclake-{len(list(root.glob('cdclake*.yml')))}.yml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def _stamp(line: dict[str, Any]) -> float:
    return dt.datetime.fromisoformat(str(line["ts"]).replace("Z", "+00:00")).timestamp()


def run_ingest(root: Path, catalog_uri: str, bootstrap: str, processes: int, events: int) -> IngestRun:
    root.mkdir(parents=True, exist_ok=True)
    config = write_config(root, catalog_uri, bootstrap, f"bench-scaleout-{processes}-{time.time_ns()}")
    command = [cdclake(), "--config", str(config), "--log-format", "json", "ingest", "--once", "--no-progress"]
    logs = [root / f"ingest-{index}.log" for index in range(processes)]
    started = time.monotonic()
    children = []
    for log_path in logs:
        with log_path.open("wb") as log_file:
            children.append(subprocess.Popen(command, stdout=log_file, stderr=subprocess.STDOUT, cwd=root))
    try:
        for child in children:
            if child.wait(timeout=1800) != 0:
                raise RuntimeError(f"an ingest process failed ({child.returncode}); see {root}/ingest-*.log")
    finally:
        for child in children:
            if child.poll() is None:
                child.kill()
                child.wait()
    result = IngestRun(processes, events, end_to_end_s=time.monotonic() - started)
    first_assigned: list[float] = []
    last_flush: list[float] = []
    last_reading_flush: list[float] = []
    for log_path in logs:
        lines = [orjson.loads(raw) for raw in log_path.read_bytes().splitlines() if raw.startswith(b"{")]
        assigned = [_stamp(line) for line in lines if str(line.get("msg", "")).startswith("assigned ")]
        flushed = [_stamp(line) for line in lines if str(line.get("msg", "")).startswith("flushed ")]
        first_assigned += assigned[:1]
        last_flush += flushed[-1:]
        waited = [_stamp(line) for line in lines if str(line.get("msg", "")).startswith("read to the end of the ")]
        last_reading_flush += [stamp for stamp in flushed if not waited or stamp <= waited[0]][-1:]
        result.flushes += len(flushed)
        summary = [line for line in lines if "records_in" in line]
        if summary:
            result.read += int(summary[-1]["records_in"])
            result.written += int(summary[-1]["written"])
            result.per_process.append(int(summary[-1]["written"]))
    if first_assigned and last_flush:
        result.steady_s = max(last_flush) - min(first_assigned)
        result.reading_s = max(last_reading_flush, default=max(last_flush)) - min(first_assigned)
    return result


def dbt_build(root: Path, config: Path, name: str) -> DbtRun:
    env = {**os.environ, RUNTIME_DIR_ENV: str(root / "runtime"), "TZ": "UTC", "DBT_SEND_ANONYMOUS_USAGE_STATS": "false"}
    started = time.monotonic()
    process = subprocess.run(
        [cdclake(), "--config", str(config), "--log-format", "text", "dbt", "build"],
        env=env,
        cwd=root,
        capture_output=True,
        text=True,
        timeout=3600,
        check=False,
    )
    wall = time.monotonic() - started
    output = process.stdout + process.stderr
    (root / f"dbt-{name}.log").write_text(output)
    if process.returncode != 0:
        raise RuntimeError(f"dbt build ({name}) failed; see {root}/dbt-{name}.log:\n{output[-3000:]}")
    match = re.search(r"Finished running .* in .*\(([\d.]+)s\)", output)
    return DbtRun(name, wall, float(match.group(1)) if match else 0.0)


def dbt_runs(root: Path, config_for: Any, settings_for: Any) -> list[DbtRun]:
    """Scaffold once, then build the same project locally, on the cluster (session), and via the thrift server."""
    runs = [dbt_build(root, config_for("silver_local", {}), "local Spark (local[2], one JVM)")]
    with SparkCluster(workers=2, cores=1, memory="1g") as cluster:
        spark = {"master": cluster.master_url, "driver_memory": "1g", "conf": {"spark.executor.memory": "768m"}}
        runs.append(dbt_build(root, config_for("silver_cluster", {"spark": spark}), "standalone cluster, session"))
        thrift_config = config_for("silver_thrift", {})
        conf = {
            **spark_conf(settings_for(thrift_config)),
            "spark.master": cluster.master_url,
            "spark.executor.memory": "768m",
            "spark.sql.warehouse.dir": str(root / "runtime" / "spark-warehouse"),
        }
        started = time.monotonic()
        with ThriftServer(conf) as thrift:
            startup = time.monotonic() - started
            dbt = {"target": "cluster", "thrift_host": thrift.host, "thrift_port": thrift.port}
            run = dbt_build(root, config_for("silver_thrift", {"dbt": dbt}), "standalone cluster, thrift server")
            run.name += f" (+{startup:.0f} s server start)"
            runs.append(run)
    return runs


def render(
    runs: list[IngestRun],
    dbt: list[DbtRun],
    catalog: str,
    value_bytes: float,
    compression: str = "none",
    arguments: Sequence[str] = (),
) -> str:
    single = runs[0].rate(runs[0].steady_s) if runs else 0.0
    lines = [
        BEGIN_MARK,
        f"{runs[0].events:,} change events ({value_bytes:,.0f} bytes per value on average, "
        f"{'uncompressed' if compression == 'none' else compression + '-compressed'} batches) on one topic with "
        f"{PARTITIONS} partitions (Tansu, memory storage), {catalog} catalog, "
        f"`max_records: {INGEST['max_records']:,}`, each process `cdclake ingest --once` in one consumer group:",
        "",
        "| processes | reading (first assignment → last commit before the handover wait) "
        "| steady (first assignment → last commit) | end to end (incl. start-up, group join) | vs 1 (steady) |",
        "|---|---|---|---|---|",
    ]
    for run in runs:
        steady = run.rate(run.steady_s)
        lines.append(
            f"| {run.processes} | {run.rate(run.reading_s):,.0f} events/s ({run.reading_s:.1f} s) | "
            f"{steady:,.0f} events/s ({run.steady_s:.1f} s) | "
            f"{run.rate(run.end_to_end_s):,.0f} events/s ({run.end_to_end_s:.1f} s) | "
            f"{steady / single if single else 0:.2f}x |"
        )
    if dbt:
        lines += ["", "`dbt build` of the resulting silver model (1 model + 4 data tests) from a cold start:", ""]
        lines += ["| where | wall time (process) | dbt's own run time |", "|---|---|---|"]
        lines += [f"| {run.name} | {run.wall_s:.1f} s | {run.models_s:.1f} s |" for run in dbt]
    command = " ".join(["python -m bench.scaleout_bench", *arguments])
    lines += [
        "",
        f"Measured {dt.datetime.now(dt.UTC):%Y-%m-%d} with `{command}` "
        f"on {os.cpu_count()} cores, Python {platform.python_version()}; load average {os.getloadavg()[0]:.1f} at "
        "the end.",
        END_MARK,
    ]
    return "\n".join(lines) + "\n"


def write_docs(section: str, path: Path = DOCS) -> None:
    text = path.read_text()
    start, end = text.find(BEGIN_MARK), text.find(END_MARK)
    if start < 0 or end < 0:
        raise SystemExit(f"{path} has no {BEGIN_MARK} ... {END_MARK} section to replace")
    path.write_text(text[:start] + section.rstrip("\n") + text[end + len(END_MARK) :])


def main(
    events: int = DEFAULT_EVENTS,
    catalog: str = "postgres",
    skip_dbt: bool = False,
    write: bool = False,
    compression: str = "none",
    arguments: Sequence[str] = (),
) -> str:
    """The benchmark (see the module's text); ``arguments``: the command line's, quoted in the section written."""
    os.environ.setdefault("TZ", "UTC")
    with tempfile.TemporaryDirectory(prefix="cdclake-scaleout-") as tmp, TansuBroker() as broker:
        root = Path(tmp)
        isolated_runtime(root)
        pg = PrivatePostgres(database="bench").start() if catalog == "postgres" else None
        try:
            print(f"publishing {events:,} events to {TOPIC} ({PARTITIONS} partitions) ...", flush=True)
            broker.create_topics([TOPIC], partitions=PARTITIONS)
            sizes: list[int] = []

            def counted() -> Iterator[Record]:
                for record in repartitioned(events):
                    sizes.append(len(record.value or b""))
                    yield record

            broker.produce(counted(), report=False, timeout_s=600, config={"compression.type": compression})
            runs: list[IngestRun] = []
            catalogs: dict[int, str] = {}
            for processes in PROCESS_COUNTS:
                directory = root / f"ingest-{processes}"
                directory.mkdir()
                uri = pg.create_database(f"lake{processes}") if pg else f"sqlite:///{directory / 'catalog.db'}"
                catalogs[processes] = uri
                print(f"cdclake ingest with {processes} process(es) ...", flush=True)
                run = run_ingest(directory, uri, broker.bootstrap_servers, processes, events)
                print(
                    f"  {run.rate(run.reading_s):,.0f} events/s reading ({run.reading_s:.1f} s), "
                    f"{run.rate(run.steady_s):,.0f} steady ({run.steady_s:.1f} s), "
                    f"{run.rate(run.end_to_end_s):,.0f} end to end ({run.end_to_end_s:.1f} s); "
                    f"written {run.written:,} ({run.per_process}), {run.flushes} flushes",
                    flush=True,
                )
                if run.written != events:
                    print(f"  note: {run.written:,} rows written for {events:,} events", flush=True)
                runs.append(run)
            dbt: list[DbtRun] = []
            if not skip_dbt:
                from ingest.config import load_settings

                lake = root / "ingest-1"
                project = lake / "dbt_project"
                ignore = shutil.ignore_patterns("target", "dbt_packages", "logs", "package-lock.yml", "models")
                shutil.copytree(PROJECT_ROOT / "dbt_project", project, ignore=ignore)
                (project / "packages.yml").write_text(f"packages:\n  - local: {PROJECT_ROOT / 'dbt_cdclake'}\n")
                (lake / "runtime").symlink_to(root / "runtime")

                def config_for(namespace: str, extra: dict[str, Any]) -> Path:
                    return write_config(
                        lake,
                        catalogs[1],
                        broker.bootstrap_servers,
                        "unused",
                        lakehouse={"silver_namespace": namespace},
                        dbt={"project_dir": str(project), **extra.pop("dbt", {})},
                        **extra,
                    )

                first = config_for("silver", {})
                subprocess.run([cdclake(), "--config", str(first), "scaffold"], cwd=lake, check=True)
                print("dbt build: local, cluster (session), cluster (thrift) ...", flush=True)
                dbt = dbt_runs(lake, config_for, lambda path: load_settings(path, environ={}))
                for build in dbt:
                    print(f"  {build.name}: {build.wall_s:.1f} s wall, {build.models_s:.1f} s in dbt", flush=True)
        finally:
            if pg is not None:
                pg.stop()
    section = render(runs, dbt, catalog, sum(sizes) / max(len(sizes), 1), compression, arguments)
    print("\n" + section)
    if write:
        write_docs(section)
        print(f"written to {DOCS}")
    return section


def cli(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.scaleout_bench", description=__doc__.split("\n")[0])
    parser.add_argument("--events", type=int, default=DEFAULT_EVENTS, help=f"events (default {DEFAULT_EVENTS:,})")
    parser.add_argument("--catalog", choices=["postgres", "sqlite"], default="postgres")
    parser.add_argument("--skip-dbt", action="store_true", help="only the ingest figures")
    parser.add_argument("--write", action="store_true", help="replace the measured section of docs/scaling.md")
    parser.add_argument("--compression", choices=["none", "lz4"], default="none", help="the topic batches' encoding")
    args = parser.parse_args(argv)
    main(
        events=args.events,
        catalog=args.catalog,
        skip_dbt=args.skip_dbt,
        write=args.write,
        compression=args.compression,
        arguments=sys.argv[1:] if argv is None else argv,
    )
    return 0


if __name__ == "__main__":
    sys.exit(cli())
