"""The driver JVM's class-data sharing archive (AppCDS).

Every Spark driver cdclake starts (`cdclake sql`, `cdclake dbt`, `cdclake demo`, the tests' sessions) loads and
verifies the same classes of Spark, Scala and Iceberg (18,000 for a session and four Iceberg statements), most of
them on its first statements. A dynamic CDS archive, written once at setup by a JVM that ran statements like those
silver runs, lets the next JVMs map them ready-parsed instead (12,000 of those 18,000): measured here
(docs/architecture.md), a driver's start and first Iceberg statements take 6.7 s instead of 9.4, and 8.3
CPU-seconds instead of 11.

`make setup` writes it (``python -m ingest.jvm_archive``) into the runtime folder and writes it again when the JDK,
pyspark or the jars change; cdclake's Spark settings point the driver at it when it is there. A JVM that cannot use
it (another JDK build, other jars) ignores it silently: Java's default ``-Xshare:auto``.
"""

from __future__ import annotations

import hashlib
import logging
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import yaml

from ingest.config import Settings
from ingest.errors import SetupError
from ingest.lakehouse import runtime_dir, spark_conf, spark_jars

log = logging.getLogger(__name__)

# An archive of its own per JDK, pyspark and jar list: the key is in the name, so a stale one is never used.
ARCHIVE_GLOB = "driver-*.jsa"

# Options under which drivers start without the archive: the user decides class sharing themselves, or runs an
# agent. JDK 17.0.15 crashed here (SIGSEGV in KlassFactory::check_shared_class_file_load_hook) loading a class
# from a dynamic archive with a flight recording started by -XX:StartFlightRecording (one started later by `jcmd
# JFR.start` did not); Java agents hook class loading the same way.
WITHOUT_ARCHIVE_OPTIONS = (
    "SharedArchiveFile",
    "ArchiveClassesAtExit",
    "-Xshare:off",
    "DynamicDumpSharedSpaces",
    "StartFlightRecording",
    "FlightRecorder",
    "-javaagent:",
    "-agentlib:",
    "-agentpath:",
)

# Statements like those a silver run sends (the classes they load are what the archive holds).
TRAINING_SQL = (
    "create namespace if not exists {c}.bronze",
    "create table {c}.bronze.t (key struct<id: int>, after struct<id: int, v: string, d: decimal(10,2)>, op string,"
    " _cdc_order array<bigint>, _cdc_offset bigint, ts timestamp) using iceberg partitioned by (days(ts))",
    "insert into {c}.bronze.t select named_struct('id', id), named_struct('id', id, 'v', cast(id as string),"
    " 'd', cast(id as decimal(10,2))), case when id % 3 = 0 then 'u' else 'c' end, array(id, 0), id,"
    " timestamp '2026-01-01 00:00:00' from range(100)",
    "select r.name, s.snapshot_id from {c}.bronze.t.refs r join {c}.bronze.t.snapshots s on r.snapshot_id ="
    " s.snapshot_id",
    "describe table {c}.bronze.t",
    "create table {c}.bronze.s using iceberg tblproperties ('write.delete.mode'='merge-on-read',"
    " 'write.update.mode'='merge-on-read', 'write.merge.mode'='merge-on-read') as"
    " select key.id as id, after.v as v, after.d as d, _cdc_order, op as _cdc_op, _cdc_offset from ("
    " select *, row_number() over (partition by key.id order by _cdc_order desc, _cdc_offset desc) as n,"
    " lag(op) over (partition by key.id order by _cdc_order) as p from {c}.bronze.t) where n = 1",
    "alter table {c}.bronze.s create branch apply",
    "delete from {c}.bronze.s.branch_apply t where exists (select 1 from {c}.bronze.t b where b.key.id = t.id"
    " and b.op = 'u')",
    "insert into {c}.bronze.s.branch_apply select key.id, get_json_object(to_json(after), '$.v'), after.d,"
    " _cdc_order, op, _cdc_offset from {c}.bronze.t where op = 'u'",
    "call {c}.system.fast_forward('bronze.s', 'main', 'apply')",
    "alter table {c}.bronze.s drop branch apply",
    "merge into {c}.bronze.s t using (select key.id as id, after.v as v, _cdc_order, _cdc_offset from {c}.bronze.t)"
    " s on t.id = s.id when matched and s._cdc_order > t._cdc_order then delete"
    " when not matched then insert (id, v, _cdc_order, _cdc_offset) values (s.id, s.v, s._cdc_order, s._cdc_offset)",
    "alter table {c}.bronze.s set tblproperties ('cdclake.trained'='1')",
    "select count(*), count_if(v is null), max(_cdc_order), aggregate(collect_list(id), 0, (a, x) -> a + x),"
    " array_join(transform(array('a', 'b'), x -> upper(x)), ','), from_json('{{\"a\": 1}}', 'map<string,int>')"
    " from {c}.bronze.s",
    "show tables in {c}.bronze",
)


def archive_key() -> str:
    """What the archive depends on: the JDK build, pyspark's jars and cdclake's."""
    import pyspark

    java = str(Path(os.environ["JAVA_HOME"]) / "bin" / "java") if os.environ.get("JAVA_HOME") else "java"
    try:
        version = subprocess.run([java, "-version"], capture_output=True, text=True, check=True).stderr
    except (OSError, subprocess.CalledProcessError) as exc:
        raise SetupError(f"cannot run {java} -version: {exc}") from exc
    pyspark_jars = sorted(p.name for p in (Path(pyspark.__file__).parent / "jars").glob("*.jar"))
    parts = [version, pyspark.__version__, *pyspark_jars, *spark_jars()]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16]


def archive_path(key: str) -> Path:
    return runtime_dir() / "jvm" / f"driver-{key}.jsa"


def current_archive() -> Path | None:
    """The archive setup wrote last (the newest), if any."""
    archives = sorted((runtime_dir() / "jvm").glob(ARCHIVE_GLOB), key=lambda p: p.stat().st_mtime)
    return archives[-1] if archives else None


def with_archive(java_options: str) -> str:
    """The driver's Java options, using the archive when there is one and the options allow it."""
    archive = current_archive()
    if archive is None or any(option in java_options for option in WITHOUT_ARCHIVE_OPTIONS):
        return java_options
    return f"{java_options} -XX:SharedArchiveFile={archive} -Xlog:cds=off,cds+dynamic=off".strip()


def driver_spark_conf(settings: Settings) -> dict[str, str]:
    """The lakehouse's Spark settings for a driver this process starts: cdclake's own sessions, and dbt-spark's
    (from the profile's settings), map the archive."""
    conf = spark_conf(settings)
    conf["spark.driver.extraJavaOptions"] = with_archive(conf.get("spark.driver.extraJavaOptions", ""))
    return conf


def write_archive(key: str) -> Path:
    """Run the training statements in a driver JVM that writes the archive when it exits."""
    from ingest.config import load_settings
    from ingest.lakehouse import load_catalog
    from ingest.spark import spark_session

    target = archive_path(key)
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_suffix(".partial")
    partial.unlink(missing_ok=True)
    with tempfile.TemporaryDirectory(prefix="cdclake-cds-") as scratch:
        root = Path(scratch)
        config = {
            "lakehouse": {"warehouse": str(root / "warehouse"), "catalog_uri": f"sqlite:///{root / 'catalog.db'}"},
            "spark": {"conf": {"spark.driver.extraJavaOptions": f"-XX:ArchiveClassesAtExit={partial} -Xlog:cds=off"}},
        }
        (root / "cdclake.yml").write_text(yaml.safe_dump(config))
        settings = load_settings(root / "cdclake.yml", environ={})
        load_catalog(settings).list_namespaces()
        spark = spark_session(settings, app_name="cdclake-cds-training")
        for statement in TRAINING_SQL:
            spark.sql(statement.format(c=settings.lakehouse.catalog_name)).collect()
        stop_and_wait(spark)
    if not partial.is_file():
        raise SetupError(f"the driver JVM exited without writing {partial}")
    for stale in target.parent.glob(ARCHIVE_GLOB):
        stale.unlink()
    partial.rename(target)
    return target


def stop_and_wait(spark: Any) -> None:
    """Stop the session and wait for its JVM to exit, which is when it writes the archive."""
    from pyspark import SparkContext

    gateway = SparkContext._gateway
    spark.stop()
    if gateway is None:
        return
    process = gateway.proc
    gateway.shutdown()
    if process.stdin is not None:
        process.stdin.close()  # pyspark's gateway server exits when its standard input closes
    process.wait(timeout=300)
    SparkContext._gateway = None
    SparkContext._jvm = None


def main() -> int:
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("[setup_runtime] %(message)s"))
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    key = archive_key()
    target = archive_path(key)
    if target.is_file():
        log.info("class-data sharing archive up to date (%s)", target)
        return 0
    log.info("writing the driver JVM's class-data sharing archive (%s)", target)
    try:
        written = write_archive(key)
    except Exception as exc:  # an optional speed-up: setup goes on without it
        log.warning("no class-data sharing archive (drivers start without one): %s", exc)
        return 0
    log.info("wrote %s (%d MB)", written, written.stat().st_size // 2**20)
    return 0


if __name__ == "__main__":
    sys.exit(main())
