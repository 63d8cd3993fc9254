"""Security: secrets never shown, hostile names never reach SQL unquoted, client security settings pass through.

The secrets are a SASL password under ``source.consumer`` and the password in a PostgreSQL ``catalog_uri``. They are
looked for in everything cdclake shows: `cdclake ingest` logs (JSON, with librdkafka's own configuration dump and
security debug logs switched on), its /metrics and /healthz, error messages, `cdclake status` (text and --json) and the
generated dbt profile. (That TLS/SASL settings reach the Kafka client unchanged is test_kafka_ingest's
test_consumer_settings_pass_through.)
"""

from __future__ import annotations

import re
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import orjson
import pytest
import yaml

from ingest.broker import TansuBroker, free_port
from ingest.bronze.naming import DEAD_LETTER_TABLE, bronze_table_name
from ingest.config import load_settings
from ingest.errors import ConfigError
from tests.conftest import ingest_file
from tests.kafka_fixtures import broker, unique  # noqa: F401 - the session fixture
from tests.processes import Cdclake
from tests.silver_harness import Change, Topic
from tests.spark_fixtures import SparkLakehouse
from tests.test_reliability import postgres_server, write_config  # noqa: F401 - a module fixture

SASL_SECRET = "sasl-Pw-7d41f0c2"
CATALOG_SECRET = "catalog-Pw-93be51aa"
SECRETS = (SASL_SECRET, CATALOG_SECRET)

HOSTILE_TOPICS = [
    "x`; DROP TABLE bronze.customers; --",
    "a'b\"c",
    "bronze.t; select 1",
    "UPPER.Case.Topic",
    "täble.ünïcode.名前",
    "2024",
    "1e10",
    "12d",
    "7L",
    "_cdc_dead_letters",
    "_cdc.dead.letters",
    "",
    "-",
    "a" * 300,
]


def _get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return int(response.status), response.read().decode()
    except urllib.error.HTTPError as error:
        return int(error.code), error.read().decode()


def assert_no_secret(where: str, text: str) -> None:
    for secret in SECRETS:
        assert secret not in text, f"{where} shows a secret:\n{text[max(text.find(secret) - 300, 0) :][:600]}"


@pytest.mark.kafka
def test_secrets_never_reach_logs_errors_status_or_metrics(
    broker: TansuBroker,  # noqa: F811
    postgres_server: Any,  # noqa: F811
    tmp_path: Path,
) -> None:
    root = tmp_path / "lake"
    server_uri = postgres_server.create_database(unique("lake_secret_"))
    # Trust authentication ignores the password, so the catalog works and the secret is in every URI cdclake uses.
    catalog_uri = server_uri.replace("://postgres@", f"://postgres:{CATALOG_SECRET}@")
    assert CATALOG_SECRET in catalog_uri
    consumer = {
        "security.protocol": "SASL_PLAINTEXT",
        "sasl.mechanism": "PLAIN",
        "sasl.username": "cdclake",
        "sasl.password": SASL_SECRET,
        "debug": "conf,security",  # librdkafka's configuration dump and its authentication logs
        "session.timeout.ms": "2000",
        "heartbeat.interval.ms": "500",
    }
    topic = Topic("ifx.secret.t")
    base: dict[str, Any] = {
        "lakehouse": {"warehouse": str(root / "warehouse"), "catalog_uri": catalog_uri},
        "ingest": {"unhealthy_after_s": 1.0},
    }

    def source(bootstrap: str) -> dict[str, Any]:
        return {"type": "kafka", "bootstrap_servers": bootstrap, "topics": [topic.name], "consumer": consumer}

    port_a, port_b = free_port(), free_port()
    # (a) the real broker, which does not accept these credentials; (b) no broker at all.
    config_a, settings = write_config(
        root,
        {**base, "source": source(broker.bootstrap_servers), "ingest": {**base["ingest"], "metrics_port": port_a}},
        "cdclake-a.yml",
    )
    config_b, _ = write_config(
        root,
        {**base, "source": source(f"127.0.0.1:{free_port()}"), "ingest": {**base["ingest"], "metrics_port": port_b}},
        "cdclake-b.yml",
    )
    # (c) a catalog that cannot be reached, for the error paths.
    unreachable = re.sub(r"@127\.0\.0\.1:\d+/", f"@127.0.0.1:{free_port()}/", catalog_uri)
    config_c, _ = write_config(root, {**base, "lakehouse": {**base["lakehouse"], "catalog_uri": unreachable}}, "c.yml")

    dump = root / "changes.jsonl"
    lines = topic.records([Change("c", i, i + 1, f"v{i}") for i in range(5)])
    dump.write_bytes(b"\n".join(orjson.dumps(line) for line in lines) + b"\n")
    ingest_file(settings, dump)

    started = time.monotonic()
    ingesters = [
        Cdclake(config, "--log-level", "DEBUG", "ingest", "--no-progress", root=root) for config in (config_a, config_b)
    ]
    try:
        shown: dict[str, str] = {}
        for name, config, args in [
            ("status", config_a, ["status", "--lag-timeout", "2"]),
            ("status --json", config_a, ["status", "--json", "--lag-timeout", "2"]),
            ("status, catalog unreachable", config_c, ["status"]),
            ("ingest --once, catalog unreachable", config_c, ["ingest", "--once", "--no-progress"]),
            # Spark's clients: one line naming the setting before a JVM starts (before, its stack trace, twice).
            ("dbt run, catalog unreachable", config_c, ["dbt", "run"]),
            ("sql, catalog unreachable", config_c, ["sql", "select 1"]),
            ("dbt-profile", config_a, ["dbt-profile"]),
        ]:
            run = Cdclake(config, *args, root=root)
            code = run.wait(120)
            shown[name] = run.output
            if "unreachable" in name:
                assert code != 0, f"{name} succeeded:\n{run.output}"
            else:
                assert code == 0, f"{name} failed ({code}):\n{run.output}"
        status = orjson.loads(shown["status --json"][shown["status --json"].index("{") :])
        assert [t["name"] for t in status["tables"]] == ["ifx_secret_t"]
        profile_dir = shown["dbt-profile"].strip().splitlines()[-1]  # the secrets' variables are named before it
        assert "set CDCLAKE_CATALOG_PASSWORD" in shown["dbt-profile"]
        shown["profiles.yml"] = (Path(profile_dir) / "profiles.yml").read_text()
        assert "CDCLAKE_CATALOG_PASSWORD" in shown["profiles.yml"]

        # (b) has never reached a broker: it must not call itself caught up (and healthy) after the group-join grace.
        time.sleep(max(0.0, 16.5 - (time.monotonic() - started)))
        code, body = _get(f"http://127.0.0.1:{port_b}/healthz")
        assert code == 503, body
        assert "no broker reachable" in body, body
        for name, port in (("a", port_a), ("b", port_b)):
            for path in ("/metrics", "/healthz"):
                shown[f"ingester {name} {path}"] = _get(f"http://127.0.0.1:{port}{path}")[1]
        for ingester in ingesters:
            ingester.terminate()
        for ingester in ingesters:
            ingester.wait(60)
    finally:
        for ingester in ingesters:
            ingester.kill()
    shown["ingester a log"], shown["ingester b log"] = ingesters[0].output, ingesters[1].output
    assert "[redacted]" in shown["ingester a log"], "librdkafka's configuration dump was not logged"
    for line in shown["ingester b log"].splitlines():
        assert isinstance(orjson.loads(line), dict), f"not a JSON log line: {line}"
    for where, text in shown.items():
        assert_no_secret(where, text)
    for name in ("status", "dbt run", "sql"):
        output = shown[f"{name}, catalog unreachable"]
        assert "error: lakehouse.catalog_uri: cannot open the Iceberg catalog database" in output, output
        assert "Traceback" not in output, output
        assert "at org.apache" not in output, output


def test_hostile_topic_names_become_plain_identifiers() -> None:
    names = [bronze_table_name(topic) for topic in HOSTILE_TOPICS]
    for topic, name in zip(HOSTILE_TOPICS, names, strict=True):
        assert re.fullmatch(r"[a-z0-9_]+", name), (topic, name)
        assert not re.fullmatch(r"[0-9]+(e[0-9]+)?(l|s|y|d|f|bd)?", name), (topic, name)  # Spark: a number
        assert name != DEAD_LETTER_TABLE, topic
        assert not name.startswith("_cdc_"), (topic, name)
    assert bronze_table_name("2024") == "t_2024"
    assert bronze_table_name("_cdc.dead.letters") == "t__cdc_dead_letters"
    assert bronze_table_name("dbserver1.inventory.customers") == "dbserver1_inventory_customers"


def test_hostile_table_mappings_are_refused(tmp_path: Path) -> None:
    for name in ["x; drop table y", "Upper", "1abc", "a.b", "_cdc_dead_letters", "", "x`y"]:
        path = tmp_path / "cdclake.yml"
        path.write_text(yaml.safe_dump({"ingest": {"table_mapping": {"some.topic": name}}}))
        with pytest.raises(ConfigError, match=r"ingest\.table_mapping"):
            load_settings(path, environ={})


def test_sql_built_from_names_quotes_what_is_not_plain(tmp_path: Path) -> None:
    """Maintenance's procedure calls and scaffold's models take table names from bronze; a name that is not a plain
    identifier is quoted, and a topic name only ever reaches YAML text, never SQL."""
    from ingest.maintenance import table_argument
    from ingest.scaffold import model_sql, model_yaml

    assert table_argument("bronze", "t_2024") == "'bronze.t_2024'"
    assert table_argument("bronze", "1_select") == "'bronze.`1_select`'"
    assert table_argument("bronze", "we`ird") == "'bronze.`we``ird`'"
    for topic in HOSTILE_TOPICS:
        table = bronze_table_name(topic)
        sql = model_sql(table, ["id"], "bronze")
        assert sql.splitlines()[1] == f"select * from {{{{ source('bronze', '{table}') }}}}", (topic, sql)
        document = model_yaml(table, ["id"], "bronze", topic)
        assert yaml.safe_load(yaml.safe_dump(document)) == document  # the topic stays text
    # A key column's name reaches dbt's not_null test, which renders it as written unless the YAML says quote.
    columns = model_yaml("t", ["id", "PART#", "order id"], "bronze", None)["models"][0]["columns"]
    assert [column.get("quote", False) for column in columns[:3]] == [False, True, True]


@pytest.mark.spark
def test_generated_table_names_parse_as_spark_identifiers(spark_lakehouse: SparkLakehouse) -> None:
    """Every bronze name cdclake derives can be written unquoted in Spark SQL (dbt renders relations unquoted)."""
    parser = spark_lakehouse.spark._jsparkSession.sessionState().sqlParser()
    for topic in HOSTILE_TOPICS:
        parser.parsePlan(f"select * from bronze.{bronze_table_name(topic)}")


def test_azure_keys_and_storage_values_are_never_shown(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An Azure storage account's key, under spark.conf (spark.hadoop.fs.azure.account.key.<account>...) and under
    lakehouse.storage (adls.account-key), was left in messages and written into the dbt profile as it is."""
    import ingest.dbt_runner as dbt_runner
    from ingest.config import redact

    spark_key = "spark.hadoop.fs.azure.account.key.acct.dfs.core.windows.net"
    config = tmp_path / "cdclake.yml"
    config.write_text(
        f"""
lakehouse:
  warehouse: abfss://lake@acct.dfs.core.windows.net/wh
  catalog_uri: sqlite:///{tmp_path}/catalog.db
  storage:
    adls.account-name: acct-name-1
    adls.account-key: AzStorageKey+111==
    adls.sas-token.acct: sv=2024&sig=Sas222
    s3.path-style-access: "true"
spark:
  conf:
    {spark_key}: AzSparkKey+333==
    spark.hadoop.fs.azure.account.keyprovider.acct.dfs.core.windows.net: org.example.KeyProvider
"""
    )
    settings = load_settings(config, environ={})
    message = redact(
        "denied for acct-name-1 with AzStorageKey+111== / sv=2024&sig=Sas222 / AzSparkKey+333==; path-style true",
        settings,
    )
    for secret in ("acct-name-1", "AzStorageKey+111==", "Sas222", "AzSparkKey+333=="):
        assert secret not in message, message
    assert message.endswith("path-style true")  # a switch is no secret

    monkeypatch.setattr(dbt_runner, "profiles_dir", lambda: tmp_path / "dbt")
    monkeypatch.setattr(dbt_runner, "driver_spark_conf", lambda s: dict(s.spark.conf))  # no jars needed
    monkeypatch.setattr(dbt_runner, "spark_conf", lambda s: dict(s.spark.conf))
    written = dbt_runner.write_profile(settings).read_text()
    assert "AzSparkKey+333==" not in written
    parameters = yaml.safe_load(written)["cdclake"]["outputs"]["session"]["server_side_parameters"]
    name = "CDCLAKE_SECRET_SPARK_HADOOP_FS_AZURE_ACCOUNT_KEY_ACCT_DFS_CORE_WINDOWS_NET"
    assert parameters[spark_key] == f"{{{{ env_var('{name}') }}}}"
    assert dbt_runner.dbt_environment(settings)[name] == "AzSparkKey+333=="
    provider = "spark.hadoop.fs.azure.account.keyprovider.acct.dfs.core.windows.net"
    assert parameters[provider] == "org.example.KeyProvider"  # a class name, no secret


LAUNCH_CAPTURE = """
import json, sys
import pyspark.java_gateway as gateway
import ingest.lakehouse
from ingest.config import load_settings
from ingest.spark import spark_session

class Launched(Exception):
    pass

def popen(command, *args, **kwargs):  # the spark-submit command line, not run
    print(json.dumps(command))
    raise Launched

gateway.Popen = popen
ingest.lakehouse.check_catalog_reachable = lambda settings: None  # no catalog database here
try:
    spark_session(load_settings(sys.argv[1], environ={}))
except Launched:
    pass
"""


def test_secrets_stay_off_the_drivers_command_line(tmp_path: Path) -> None:
    """pyspark launches the driver as `spark-submit --conf KEY=VALUE ...`, which `ps` shows any local user: the
    catalog's password, a JDBC URL with one, and the storage's keys are set on the running session instead."""
    import subprocess
    import sys

    config = tmp_path / "cdclake.yml"
    config.write_text(
        yaml.safe_dump(
            {
                "lakehouse": {
                    "warehouse": str(tmp_path / "warehouse"),
                    "catalog_uri": "postgresql+psycopg2://u:S3cretPw@127.0.0.1:1/db?sslpassword=K3yPw",
                },
                "spark": {"conf": {"spark.hadoop.fs.s3a.secret.key": "S3cretKey", "spark.ui.enabled": "false"}},
            }
        )
    )
    run = subprocess.run(
        [sys.executable, "-c", LAUNCH_CAPTURE, str(config)], capture_output=True, text=True, timeout=120
    )
    assert run.returncode == 0, run.stderr
    command = " ".join(orjson.loads(run.stdout.strip().splitlines()[-1]))
    assert "spark.ui.enabled=false" in command  # the capture works: the other settings are there
    assert "spark.sql.catalog.lake.jdbc.user=u" in command
    for secret in ("S3cretPw", "K3yPw", "S3cretKey"):
        assert secret not in command


def test_secrets_are_set_on_the_running_session(spark_lakehouse: SparkLakehouse) -> None:
    """What split_secrets keeps off the command line reaches the session: catalog settings as session settings,
    Hadoop's in its configuration."""
    from ingest.spark import apply_secrets, split_secrets

    conf = {"spark.hadoop.fs.test.secret.key": "hadoop-secret", "spark.sql.catalog.other.jdbc.password": "pw"}
    launch, secrets = split_secrets({**conf, "spark.ui.enabled": "false"})
    assert launch == {"spark.ui.enabled": "false"}
    assert secrets == conf
    spark = spark_lakehouse.spark
    apply_secrets(spark, secrets)
    try:
        assert spark.sparkContext._jsc.hadoopConfiguration().get("fs.test.secret.key") == "hadoop-secret"
        assert spark.conf.get("spark.sql.catalog.other.jdbc.password") == "pw"
    finally:
        spark.sparkContext._jsc.hadoopConfiguration().unset("fs.test.secret.key")
        spark.conf.unset("spark.sql.catalog.other.jdbc.password")


def test_an_unexpected_error_is_logged_without_its_secrets(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """An error no code path expected reaches the top of the command, which logs it with its traceback (JSON logs,
    as in a container): before, its text went out as it was, a secret it quoted included (the health endpoint's
    reason was redacted, the log line of the same error was not). Every line cdclake's log handler writes is
    redacted now, the traceback too; a host program's handlers (pytest's here) are left alone."""
    import logging

    import ingest.cli.status_cmd as status_cmd
    from ingest.cli import main

    secret = "SaslPw-4242-xyz"
    config = tmp_path / "cdclake.yml"
    config.write_text(
        yaml.safe_dump(
            {
                "lakehouse": {"warehouse": str(tmp_path / "wh"), "catalog_uri": f"sqlite:///{tmp_path}/catalog.db"},
                "source": {
                    "type": "kafka",
                    "bootstrap_servers": "127.0.0.1:1",
                    "topics": ["t"],
                    "consumer": {"sasl.password": secret},
                },
            }
        )
    )
    (tmp_path / "catalog.db").touch()

    def failing(*_args: Any, **_kwargs: Any) -> Any:
        raise RuntimeError(f"the driver said: password {secret} rejected")

    monkeypatch.setattr(status_cmd, "collect_status", failing)
    monkeypatch.setattr("sys.argv", ["cdclake", "--log-format", "json", "--config", str(config), "status"])
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    try:
        with pytest.raises(SystemExit) as exited:
            main()
    finally:
        root.handlers[:] = handlers
        root.setLevel(level)
    assert exited.value.code == 1
    lines = [orjson.loads(line) for line in capsys.readouterr().err.splitlines() if line.startswith("{")]
    failed = [line for line in lines if line["msg"].startswith("failed: ")]
    assert len(failed) == 1, lines
    assert "rejected" in failed[0]["msg"]
    assert "RuntimeError: the driver said" in failed[0]["exc"]
    assert secret not in str(lines)
