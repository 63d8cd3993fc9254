"""Smoke test of the JVM runtime assembled by scripts/setup_runtime.sh.

Proves that pyiceberg and Spark share one Iceberg JDBC catalog on SQLite: pyiceberg creates and
appends (with snapshot properties), Spark reads, creates a v2 merge-on-read table and MERGEs into
it, and pyiceberg can still commit while the Spark session is alive (no `database is locked`).

Run:  .venv/bin/python scripts/smoke_spark_iceberg.py      (exit 0 only if every check holds)
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

# Before the JVM is spawned: it inherits TZ, and pyspark converts timestamps with the local zone.
os.environ["TZ"] = "UTC"
time.tzset()
# Spark otherwise resolves the hostname, warns, and serves spark.jars on the external interface.
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")

ROOT = Path(__file__).resolve().parent.parent
CLASSPATH = ROOT / ".cdclake" / "jars" / "classpath.txt"
CATALOG = "lake"  # must match on both sides: it is stored in the catalog_name column

T0 = time.perf_counter()
_last = T0


def step(msg: str) -> None:
    global _last
    now = time.perf_counter()
    print(f"[smoke] {now - T0:6.2f}s (+{now - _last:5.2f}s) {msg}", flush=True)
    _last = now


def check(cond: bool, msg: str) -> None:
    if not cond:
        raise AssertionError(msg)


def spark_conf(tmp: Path, jars: str) -> dict[str, str]:
    cat = f"spark.sql.catalog.{CATALOG}"
    return {
        "spark.jars": jars,
        "spark.sql.extensions": "org.apache.iceberg.spark.extensions.IcebergSparkSessionExtensions",
        cat: "org.apache.iceberg.spark.SparkCatalog",
        f"{cat}.type": "jdbc",
        f"{cat}.uri": f"jdbc:sqlite:{tmp}/catalog.db",
        # pyiceberg creates the catalog tables; Iceberg's init leaves a ResultSet open that
        # holds a SQLite lock for the JVM's lifetime.
        f"{cat}.jdbc.init-catalog-tables": "false",
        f"{cat}.jdbc.schema-version": "V1",
        # otherwise a long-lived session never sees commits made by other processes
        f"{cat}.cache-enabled": "false",
        f"{cat}.warehouse": f"file://{tmp}/warehouse",
        "spark.sql.defaultCatalog": CATALOG,
        "spark.sql.catalogImplementation": "in-memory",  # no Derby metastore_db/
        "spark.sql.warehouse.dir": str(tmp / "spark-warehouse"),  # no ./spark-warehouse
        "spark.sql.session.timeZone": "UTC",
        "spark.driver.extraJavaOptions": "-Duser.timezone=UTC",
        "spark.driver.memory": "1g",
        "spark.sql.shuffle.partitions": "2",
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        # loopback only: jars are served to the (in-JVM) executor over the driver's address
        "spark.driver.host": "127.0.0.1",
        "spark.driver.bindAddress": "127.0.0.1",
    }


def main() -> int:
    check(CLASSPATH.is_file(), f"{CLASSPATH} missing: run scripts/setup_runtime.sh first")
    jars = CLASSPATH.read_text().strip()

    import pyarrow as pa
    from pyiceberg.catalog.sql import SqlCatalog

    step("imported pyarrow + pyiceberg")
    tmp = Path(tempfile.mkdtemp(prefix="cdclake-smoke-"))
    spark = None
    ok = False
    try:
        catalog = SqlCatalog(CATALOG, uri=f"sqlite:///{tmp}/catalog.db", warehouse=f"file://{tmp}/warehouse")
        catalog.create_namespace("bronze")
        schema = pa.schema(
            [
                pa.field("id", pa.int64(), nullable=False),
                pa.field("name", pa.string()),
                pa.field("amount", pa.float64()),
                pa.field("op", pa.string()),
                pa.field("ts", pa.timestamp("us", tz="UTC")),
            ]
        )
        bronze = catalog.create_table("bronze.events", schema=schema)

        def batch(rows: list[tuple[object, ...]]) -> pa.Table:
            cols = list(zip(*rows, strict=True))
            return pa.table([pa.array(c, type=f.type) for c, f in zip(cols, schema, strict=True)], schema=schema)

        ts = 1_700_000_000_000_000  # µs since epoch = 2023-11-14T22:13:20Z
        offsets1 = json.dumps({"orders": {"0": 3}})
        bronze.append(
            batch([(1, "a", 10.0, "c", ts), (2, "b", 20.0, "c", ts), (3, "c", 30.0, "c", ts)]),
            snapshot_properties={"cdclake.offsets": offsets1},
        )
        step("pyiceberg: catalog, namespace, table, append")

        from pyspark.sql import SparkSession

        builder = SparkSession.builder.master("local[2]").appName("cdclake-smoke")
        for k, v in spark_conf(tmp, jars).items():
            builder = builder.config(k, v)
        spark = builder.getOrCreate()
        spark.sparkContext.setLogLevel("WARN")
        step("SparkSession started")

        jvm: Any = spark.sparkContext._jvm

        def scalar(sql: str) -> Any:
            return spark.sql(sql).collect()[0][0]

        check(jvm.java.lang.System.getProperty("user.timezone") == "UTC", "JVM user.timezone is not UTC")
        rows = spark.sql("SELECT id, name, amount, ts FROM bronze.events ORDER BY id").collect()
        check([r.id for r in rows] == [1, 2, 3], f"spark read of pyiceberg table: {rows}")
        check(str(rows[0].ts) == "2023-11-14 22:13:20", f"timestamp not UTC-naive: {rows[0].ts}")
        # sqlite-jdbc loads libsqlitejdbc.so (Debian's libxerial-sqlite-jdbc-jni) from java.library.path
        print(f"[smoke] sqlite-jdbc native mode: {jvm.org.sqlite.SQLiteJDBCLoader.isNativeMode()}", flush=True)
        step("spark: read pyiceberg table")

        spark.sql("CREATE NAMESPACE IF NOT EXISTS silver")
        spark.sql(
            """CREATE TABLE silver.x (id BIGINT, name STRING, amount DOUBLE, ts TIMESTAMP) USING iceberg
               TBLPROPERTIES ('format-version'='2', 'write.delete.mode'='merge-on-read',
                              'write.update.mode'='merge-on-read', 'write.merge.mode'='merge-on-read')"""
        )
        spark.sql("INSERT INTO silver.x SELECT id, name, amount, ts FROM bronze.events")
        step("spark: CREATE TABLE silver.x + INSERT")

        spark.createDataFrame(
            [(1, "a2", 11.0, "u"), (2, None, None, "d"), (4, "d", 40.0, "c")],
            "id BIGINT, name STRING, amount DOUBLE, op STRING",
        ).createOrReplaceTempView("changes")
        spark.sql(
            """MERGE INTO silver.x t
               USING (SELECT *, TIMESTAMP '2023-11-15 00:00:00' AS ts FROM changes) s
               ON t.id = s.id
               WHEN MATCHED AND s.op = 'd' THEN DELETE
               WHEN MATCHED THEN UPDATE SET t.name = s.name, t.amount = s.amount, t.ts = s.ts
               WHEN NOT MATCHED AND s.op <> 'd' THEN INSERT (id, name, amount, ts)
                 VALUES (s.id, s.name, s.amount, s.ts)"""
        )
        got = {r.id: (r.name, r.amount) for r in spark.sql("SELECT * FROM silver.x").collect()}
        check(got == {1: ("a2", 11.0), 3: ("c", 30.0), 4: ("d", 40.0)}, f"MERGE result: {got}")
        # merge-on-read really wrote delete files (content 1 = position deletes)
        n_del = scalar("SELECT count(*) FROM silver.x.delete_files")
        check(n_del > 0, "MERGE wrote no delete files: not merge-on-read")
        step(f"spark: MERGE INTO (delete/update/insert), {n_del} delete file(s)")

        summ = spark.sql(
            "SELECT summary['cdclake.offsets'] AS o FROM bronze.events.snapshots ORDER BY committed_at"
        ).collect()
        check([r.o for r in summ] == [offsets1], f".snapshots summary: {summ}")
        step("spark: .snapshots shows cdclake.offsets")

        # pyiceberg commits while the JVM still holds its SQLite connection(s)
        offsets2 = json.dumps({"orders": {"0": 5}})
        catalog.load_table("bronze.events").append(
            batch([(5, "e", 50.0, "c", ts), (6, "f", 60.0, "c", ts)]),
            snapshot_properties={"cdclake.offsets": offsets2},
        )
        step("pyiceberg: append while Spark session is alive")
        n = scalar("SELECT count(*) FROM bronze.events")
        check(n == 5, f"spark sees {n} rows after pyiceberg append, expected 5")
        last = scalar(
            "SELECT summary['cdclake.offsets'] FROM bronze.events.snapshots ORDER BY committed_at DESC LIMIT 1"
        )
        check(last == offsets2, f"latest offsets {last}")
        step("spark: sees pyiceberg's new snapshot")

        # and the other way round: pyiceberg reads Spark's merge-on-read table (with deletes),
        # then commits again after a Spark commit
        spark.sql("INSERT INTO bronze.events VALUES (7, 'g', 70.0, 'c', TIMESTAMP '2023-11-15 00:00:00')")
        ids = sorted(catalog.load_table("silver.x").scan().to_arrow()["id"].to_pylist())
        check(ids == [1, 3, 4], f"pyiceberg read of silver.x: {ids}")
        catalog.load_table("bronze.events").append(batch([(8, "h", 80.0, "c", ts)]))
        n = scalar("SELECT count(*) FROM bronze.events")
        check(n == 7, f"after interleaved commits spark sees {n} rows, expected 7")
        step("interleaved Spark/pyiceberg commits, pyiceberg reads MoR table")
        ok = True
    except Exception:
        traceback.print_exc()
    finally:
        if spark is not None:
            spark.stop()
        if ok:
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            print(f"[smoke] kept {tmp} for inspection", file=sys.stderr)
    step("PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
