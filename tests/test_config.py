"""cdclake.yml: the documented format validates; mistakes fail naming the key; secrets stay hidden."""

from __future__ import annotations

import logging
import re
from pathlib import Path

import pytest
import yaml

from ingest.config import Settings, load_settings, redact
from ingest.errors import ConfigError


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "cdclake.yml"
    path.write_text(text)
    return path


def test_documented_format_loads(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        """
lakehouse:
  warehouse: /abs/path/warehouse
  catalog_uri: sqlite:////abs/path/catalog.db
source:
  type: kafka
  bootstrap_servers: 127.0.0.1:9092
  topics: [dbserver1.inventory.customers]
  consumer:
    security.protocol: SASL_SSL
""",
    )
    settings = load_settings(path, environ={})
    source = settings.require_source()
    assert source.topics == ["dbserver1.inventory.customers"]
    assert source.consumer_config() == {"security.protocol": "SASL_SSL"}
    assert settings.lakehouse.catalog_uri.get_secret_value() == "sqlite:////abs/path/catalog.db"


def test_unknown_key_is_named(tmp_path: Path) -> None:
    path = write(tmp_path, "source:\n  type: kafka\n  topics: [a]\n  bootstrap_server: x\n")
    with pytest.raises(ConfigError, match=r"source\.bootstrap_server: Extra inputs are not permitted"):
        load_settings(path, environ={})


def test_bad_value_is_named(tmp_path: Path) -> None:
    path = write(tmp_path, "ingest:\n  max_records: -3\n")
    with pytest.raises(ConfigError, match=r"ingest\.max_records"):
        load_settings(path, environ={})


def test_file_source_needs_path(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"source\.path is required"):
        load_settings(write(tmp_path, "source:\n  type: file\n"), environ={})


def test_env_overrides_every_key(tmp_path: Path) -> None:
    path = write(tmp_path, "source:\n  type: kafka\n  topics: [a]\n")
    env = {
        "CDCLAKE__SOURCE__BOOTSTRAP_SERVERS": "broker:9093",
        "CDCLAKE__INGEST__MAX_RECORDS": "42",
        "CDCLAKE__SOURCE__TOPICS": "[x, y]",
        "CDCLAKE__SOURCE__CONSUMER__SASL_PASSWORD": "hunter2-secret",
    }
    settings = load_settings(path, environ=env)
    source = settings.require_source()
    assert source.bootstrap_servers == "broker:9093"
    assert source.topics == ["x", "y"]
    assert settings.ingest.max_records == 42
    assert source.consumer_config()["sasl.password"] == "hunter2-secret"


def test_secrets_from_environment_are_never_shown(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        """
lakehouse:
  catalog_uri: postgresql+psycopg2://iceberg:${DB_PASS}@db:5432/iceberg
source:
  type: kafka
  topics: [a]
  consumer:
    sasl.password: ${SASL_PASS}
""",
    )
    settings = load_settings(path, environ={"DB_PASS": "pg-secret-1", "SASL_PASS": "sasl-secret-2"})
    shown = repr(settings) + str(settings.model_dump())
    assert "pg-secret-1" not in shown
    assert "sasl-secret-2" not in shown
    message = redact("failed with sasl-secret-2 at postgresql://iceberg:pg-secret-1@db", settings)
    assert "secret" not in message
    assert "***" in message


def test_every_configured_secret_is_redacted(tmp_path: Path) -> None:
    """Not only the URI's password: its sslpassword (which Spark's JDBC URL carries, and Iceberg's connection error
    prints), a password with an empty user name, and Spark settings that hold a secret or a URL with one."""
    path = write(
        tmp_path,
        """
lakehouse:
  catalog_uri: postgresql+psycopg2://:Sup3rSecret@db/cat?sslmode=verify-full&sslpassword=KeyPass99
spark:
  conf:
    spark.sql.catalog.lake.jdbc.password: JdbcPass77
    spark.sql.catalog.lake.uri: jdbc:postgresql://proxy:5432/cat?user=u&password=UrlPass55&ssl=true
    spark.hadoop.fs.s3a.secret.key: S3Secret44
    spark.app.name: not-a-secret
    spark.security.credentials.hive.enabled: "false"
""",
    )
    settings = load_settings(path, environ={})
    message = redact(
        "Failed to connect: jdbc:postgresql://db/cat?sslmode=verify-full&sslpassword=KeyPass99 (Sup3rSecret), "
        "JdbcPass77, jdbc:postgresql://proxy:5432/cat?user=u&password=UrlPass55&ssl=true, S3Secret44, not-a-secret",
        settings,
    )
    for secret in ("KeyPass99", "Sup3rSecret", "JdbcPass77", "UrlPass55", "S3Secret44"):
        assert secret not in message
    assert "sslmode=verify-full" in message
    assert "not-a-secret" in message
    assert redact("lag_checked: false", settings) == "lag_checked: false"
    # Spark's JDBC URL encodes the sslpassword again (urlencode): that form is redacted too.
    special = "lakehouse:\n  catalog_uri: postgresql://iceberg@db/cat?sslmode=require&sslpassword=Secr3t!x$y\n"
    reencoded = load_settings(write(tmp_path, special), environ={})
    assert redact("jdbc:postgresql://db/cat?sslpassword=Secr3t%21x%24y", reencoded) == (
        "jdbc:postgresql://db/cat?sslpassword=***"
    )
    # A password with a raw '/' (SQLAlchemy reads everything up to the '@').
    raw_slash = "lakehouse:\n  catalog_uri: postgresql://cdc:ab/cd1@db/catalog\n"
    slash = load_settings(write(tmp_path, raw_slash), environ={})
    assert "ab/cd1" not in redact("could not connect as cdc with ab/cd1", slash)


def test_a_numeric_password_is_redacted_but_not_inside_numbers(tmp_path: Path) -> None:
    """`status --json` redacted its serialized text: with the catalog password 4711, a row count of 1047112 became
    `10***2` and offset 47110 `***0`, which is not JSON. Numbers in documents are left alone now, and in text a
    numeric secret only where no digit adjoins it."""
    from ingest.config import redact_values

    config = write(tmp_path, "lakehouse:\n  catalog_uri: postgresql://iceberg:4711@db/cat\n")
    settings = load_settings(config, environ={})
    assert redact("rows 1047112, next offset 47110; login iceberg:4711@db failed", settings) == (
        "rows 1047112, next offset 47110; login iceberg:***@db failed"
    )
    document = {"rows": 1047112, "offset": 4711, "tables": [{"error": "password 4711 refused", "lag": [47110]}]}
    assert redact_values(document, settings) == {
        "rows": 1047112,
        "offset": 4711,
        "tables": [{"error": "password *** refused", "lag": [47110]}],
    }


def test_missing_env_reference_is_named(tmp_path: Path) -> None:
    path = write(tmp_path, "source:\n  type: kafka\n  topics: [a]\n  consumer:\n    sasl.password: ${NOPE}\n")
    with pytest.raises(ConfigError, match=r"NOPE is referenced but not set"):
        load_settings(path, environ={})


def test_config_file_from_environment(tmp_path: Path) -> None:
    path = write(tmp_path, "ingest:\n  max_records: 7\n")
    assert load_settings(environ={"CDCLAKE_CONFIG": str(path)}).ingest.max_records == 7
    with pytest.raises(ConfigError, match="file not found"):
        load_settings(environ={"CDCLAKE_CONFIG": str(tmp_path / "missing.yml")})


def test_a_missing_config_file_is_named_where_it_was_given(tmp_path: Path) -> None:
    """Through the CLI too, a CDCLAKE_CONFIG that names no file is reported as CDCLAKE_CONFIG (it was reported as
    a --config option, which a container's user never passed); --config wins over it."""
    from click.testing import CliRunner

    from ingest.cli import cli

    missing = tmp_path / "missing.yml"
    runner = CliRunner()
    result = runner.invoke(cli, ["status"], env={"CDCLAKE_CONFIG": str(missing)})
    assert str(result.exception) == f"CDCLAKE_CONFIG={missing}: file not found"
    result = runner.invoke(cli, ["--config", str(missing), "status"], env={"CDCLAKE_CONFIG": "/elsewhere.yml"})
    assert str(result.exception) == f"--config {missing}: file not found"
    other = write(tmp_path, "ingest:\n  max_recordz: 5\n")
    result = runner.invoke(cli, ["status"], env={"CDCLAKE_CONFIG": str(other)})
    assert str(result.exception) == f"{other}: ingest.max_recordz: Extra inputs are not permitted"


def test_relative_paths_resolve_against_the_config_file(tmp_path: Path) -> None:
    path = write(tmp_path, "lakehouse:\n  warehouse: lh/wh\n")
    settings = load_settings(path, environ={})
    assert settings.resolve(settings.lakehouse.warehouse) == (tmp_path / "lh" / "wh").resolve()


def test_env_values_that_look_like_yaml(tmp_path: Path) -> None:
    """A list in an override is YAML (`[x, y]`); a librdkafka setting or a secret is taken as written, even when it
    starts with `{` or `[`; an override that starts like YAML but is not fails naming the variable, never its value
    (which may be a secret); an empty value stays empty."""
    path = write(tmp_path, "source:\n  type: kafka\n  topics: [a]\n")
    env = {
        "CDCLAKE__SOURCE__CONSUMER__SASL_PASSWORD": "{S3cr3t-pw",
        "CDCLAKE__SOURCE__CONSUMER__CLIENT_ID": "[cdclake]",
        "CDCLAKE__SOURCE__GROUP_ID": "",
    }
    source = load_settings(path, environ=env).require_source()
    assert source.consumer_config() == {"sasl.password": "{S3cr3t-pw", "client.id": "[cdclake]"}
    assert source.group_id == ""
    with pytest.raises(ConfigError, match=r"^CDCLAKE__SOURCE__TOPICS: starts like a YAML list") as failure:
        load_settings(path, environ={"CDCLAKE__SOURCE__TOPICS": "[a, {S3cr3t"})
    assert "S3cr3t" not in str(failure.value)


def test_env_values_take_the_type_of_their_key(tmp_path: Path) -> None:
    """A text key takes the value as written even when it starts like YAML (an IPv6 broker, a regex with a
    character class); `null` unsets a key that may be unset; a map set as YAML adds to the file's entries; a
    variable for one entry of a map whose keys no variable name can spell is an error naming the map."""
    path = write(tmp_path, "source:\n  type: kafka\n  topics: [a]\nspark:\n  conf:\n    spark.ui.enabled: 'false'\n")
    env = {
        "CDCLAKE__SOURCE__BOOTSTRAP_SERVERS": "[::1]:9092",
        "CDCLAKE__SOURCE__TOPICS": "[]",
        "CDCLAKE__SOURCE__TOPIC_PATTERN": "[ab]server1\\..*",
        "CDCLAKE__INGEST__METRICS_PORT": "null",
        "CDCLAKE__MAINTENANCE__SILVER__DELETE_FILE_THRESHOLD": "",
        "CDCLAKE__DBT__THRIFT_HOST": "null",  # a text key that may be unset
        "CDCLAKE__SPARK__CONF": "{spark.sql.shuffle.partitions: '8'}",
    }
    settings = load_settings(path, environ=env)
    source = settings.require_source()
    assert (source.bootstrap_servers, source.topic_pattern) == ("[::1]:9092", "[ab]server1\\..*")
    assert settings.ingest.metrics_port is None
    assert settings.maintenance.silver.delete_file_threshold is None
    # Another key of the section keeps silver's default (a default of the section's factory was lost with it).
    by_key = {"CDCLAKE__MAINTENANCE__SILVER__RETAIN_LAST": "5"}
    for env in (by_key, {"CDCLAKE__MAINTENANCE__SILVER": "{retain_last: 5}"}):
        silver = load_settings(path, environ={"CDCLAKE__SOURCE__TOPICS": "[a]", **env}).maintenance.silver
        assert (silver.retain_last, silver.delete_file_threshold) == (5, 1)
    assert settings.dbt.thrift_host is None
    assert settings.spark.conf == {"spark.ui.enabled": "false", "spark.sql.shuffle.partitions": "8"}
    assert load_settings(path, environ={"CDCLAKE__SOURCE__TOPIC_PATTERN": "[a-c]", "CDCLAKE__SOURCE__TOPICS": "[]"})
    for name in ("CDCLAKE__SPARK__CONF__SPARK_SQL_SHUFFLE_PARTITIONS", "CDCLAKE__INGEST__TABLE_MAPPING__DB_T"):
        with pytest.raises(ConfigError, match=rf"^{name}: the keys of (spark\.conf|ingest\.table_mapping) .*YAML"):
            load_settings(path, environ={name: "x"})


def test_errors_in_env_values_name_the_variable(tmp_path: Path) -> None:
    path = write(tmp_path, "ingest:\n  max_records: 1000\n")
    with pytest.raises(ConfigError, match=r"ingest\.max_records \(set by CDCLAKE__INGEST__MAX_RECORDS\): Input should"):
        load_settings(path, environ={"CDCLAKE__INGEST__MAX_RECORDS": "0"})
    with pytest.raises(ConfigError, match=r"ingest\.max_record \(set by CDCLAKE__INGEST__MAX_RECORD\): Extra inputs"):
        load_settings(path, environ={"CDCLAKE__INGEST__MAX_RECORD": "5"})
    with pytest.raises(ConfigError, match=r"ingest\.max_records: Input should be greater") as failure:
        load_settings(write(tmp_path, "ingest:\n  max_records: 0\n"), environ={})
    assert "set by" not in str(failure.value)


def test_errors_about_a_section_name_the_variable_inside_it(tmp_path: Path) -> None:
    """A misspelt section, or a section a variable made invalid: the error names the variable, not only the file
    that never held the key."""
    path = write(tmp_path, "source:\n  type: kafka\n  topics: [a]\n")
    inside = r"maintainance \(the environment sets CDCLAKE__MAINTAINANCE__BRONZE__RETAIN_LAST in it\)"
    with pytest.raises(ConfigError, match=inside):
        load_settings(path, environ={"CDCLAKE__MAINTAINANCE__BRONZE__RETAIN_LAST": "3"})
    inside = r"source \(the environment sets CDCLAKE__SOURCE__TYPE in it\): .*source\.path is required"
    with pytest.raises(ConfigError, match=inside):
        load_settings(path, environ={"CDCLAKE__SOURCE__TYPE": "file"})


def test_a_yaml_error_does_not_quote_the_line(tmp_path: Path) -> None:
    """PyYAML's message quotes the line at fault, which may be a password that YAML reads as syntax: the error
    says where, not what the line holds."""
    path = write(tmp_path, "source:\n  type: kafka\n  consumer:\n    sasl.password: @Hunter2secret\n")
    with pytest.raises(
        ConfigError, match=r"not valid YAML: .*'@' that cannot start any token at line 4, column 20$"
    ) as e:
        load_settings(path, environ={})
    assert "Hunter2secret" not in str(e.value)
    # An unclosed quote; a tag (!...) or an alias (*...) the composer or constructor quotes in its message.
    for value in ('"Hunter2secret', "!Hunter2secret", "*Hunter2secret"):
        broken = write(tmp_path, f"source:\n  consumer:\n    sasl.password: {value}\n")
        with pytest.raises(ConfigError, match=r"not valid YAML: .* at line \d+, column \d+$") as e:
            load_settings(broken, environ={})
        assert "Hunter2secret" not in str(e.value), value


def test_env_names_are_case_insensitive_for_librdkafka_settings_too(tmp_path: Path) -> None:
    path = write(tmp_path, "source:\n  type: kafka\n  topics: [a]\n")
    env = {"CDCLAKE__source__consumer__sasl_username": "u", "CDCLAKE__SOURCE__Consumer__Security_Protocol": "SSL"}
    source = load_settings(path, environ=env).require_source()
    assert source.consumer_config() == {"sasl.username": "u", "security.protocol": "SSL"}


def test_the_spark_catalog_url_keeps_the_connection_parameters(tmp_path: Path) -> None:
    """Spark reaches the PostgreSQL catalog as pyiceberg does: TLS and search_path settings and an IPv6 host carry
    over to the JDBC URL; a parameter without a JDBC equivalent fails naming it (unless spark.conf sets the URL);
    the password is redacted as written and as the drivers use it (percent-decoded)."""
    from ingest.lakehouse import jdbc_catalog_conf, spark_conf

    uri = (
        "postgresql+psycopg2://iceberg:p%40ss-word@[fd00::5]:5432/iceberg"
        "?sslmode=verify-full&sslrootcert=/etc/ca.pem&options=-csearch_path%3Dcatalog"
    )
    settings = load_settings(write(tmp_path, f"lakehouse:\n  catalog_uri: '{uri}'\n"), environ={})
    conf = jdbc_catalog_conf(settings)
    assert conf["spark.sql.catalog.lake.uri"] == (
        "jdbc:postgresql://[fd00::5]:5432/iceberg"
        "?sslmode=verify-full&sslrootcert=%2Fetc%2Fca.pem&options=-csearch_path%3Dcatalog"
    )
    assert conf["spark.sql.catalog.lake.jdbc.password"] == "p@ss-word"
    assert redact("p@ss-word p%40ss-word", settings) == "*** ***"
    socket = "postgresql+psycopg2://iceberg@/iceberg?host=/var/run/postgresql"
    with pytest.raises(ConfigError, match=r"lakehouse\.catalog_uri: the connection parameter 'host'"):
        jdbc_catalog_conf(load_settings(write(tmp_path, f"lakehouse:\n  catalog_uri: '{socket}'\n"), environ={}))
    own = "spark:\n  conf:\n    spark.sql.catalog.lake.uri: jdbc:postgresql://pg-proxy:5432/iceberg\n"
    settings = load_settings(write(tmp_path, f"lakehouse:\n  catalog_uri: '{socket}'\n{own}"), environ={})
    assert spark_conf(settings)["spark.sql.catalog.lake.uri"] == "jdbc:postgresql://pg-proxy:5432/iceberg"


def test_the_dbt_profile_references_every_secret(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The generated dbt profile holds no secret Spark setting (the catalog's password, an S3 secret key), only
    env_var() references that `cdclake dbt` sets; the file is readable by its owner only."""
    import ingest.dbt_runner as dbt_runner

    text = """
lakehouse:
  catalog_uri: postgresql+psycopg2://iceberg:pg-secret-1@db:5432/iceberg?sslmode=verify-full&sslpassword=key-secret-3
spark:
  conf:
    spark.hadoop.fs.s3a.access.key: AKIAEXAMPLE
    spark.hadoop.fs.s3a.secret.key: s3-secret-2
    spark.sql.catalog.other.uri: jdbc:postgresql://db2/cat?user=u&password=other-secret-4
"""
    settings = load_settings(write(tmp_path, text), environ={})
    monkeypatch.setattr(dbt_runner, "profiles_dir", lambda: tmp_path / "dbt")
    written = dbt_runner.write_profile(settings).read_text()
    for secret in ("pg-secret-1", "s3-secret-2", "key-secret-3", "other-secret-4"):
        assert secret not in written
    parameters = yaml.safe_load(written)["cdclake"]["outputs"]["session"]["server_side_parameters"]
    assert parameters["spark.sql.catalog.lake.jdbc.password"] == "{{ env_var('CDCLAKE_CATALOG_PASSWORD') }}"
    secret = "{{ env_var('CDCLAKE_SECRET_SPARK_HADOOP_FS_S3A_SECRET_KEY') }}"
    assert parameters["spark.hadoop.fs.s3a.secret.key"] == secret
    assert parameters["spark.hadoop.fs.s3a.access.key"] == "AKIAEXAMPLE"  # an access key id is not a secret
    assert (tmp_path / "dbt" / "profiles.yml").stat().st_mode & 0o077 == 0
    environment = dbt_runner.dbt_environment(settings)
    assert environment["CDCLAKE_CATALOG_PASSWORD"] == "pg-secret-1"
    assert environment["CDCLAKE_SECRET_SPARK_HADOOP_FS_S3A_SECRET_KEY"] == "s3-secret-2"
    # A URL with a secret in its query is referenced whole: the catalog's JDBC URL (sslpassword), any other.
    assert parameters["spark.sql.catalog.lake.uri"] == "{{ env_var('CDCLAKE_SECRET_SPARK_SQL_CATALOG_LAKE_URI') }}"
    assert "sslpassword=key-secret-3" in environment["CDCLAKE_SECRET_SPARK_SQL_CATALOG_LAKE_URI"]
    assert environment["CDCLAKE_SECRET_SPARK_SQL_CATALOG_OTHER_URI"].endswith("password=other-secret-4")


@pytest.mark.dbt
def test_a_dbt_run_reads_its_own_profile_while_another_config_rewrites_the_shared_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two `cdclake dbt` of one install with two cdclake.yml (two lakehouses) at once: the well-known profile is
    the last writer's, so each run reads a copy of its own (real dbt parses with it)."""
    import shutil

    from dbt.cli.main import dbtRunner

    import ingest.dbt_runner as dbt_runner
    from ingest.lakehouse import PROJECT_ROOT
    from tests.conftest import make_settings

    project = tmp_path / "dbt_project"
    shutil.copytree(PROJECT_ROOT / "deploy" / "dbt_project", project)
    (project / "packages.yml").write_text(f"packages:\n  - local: {PROJECT_ROOT / 'dbt_cdclake'}\n")
    ours = make_settings(tmp_path / "ours", dbt={"project_dir": str(project)})
    theirs = make_settings(tmp_path / "theirs")
    monkeypatch.setattr(dbt_runner, "profiles_dir", lambda: tmp_path / "dbt")
    read: list[dict[str, object]] = []
    real_invoke = dbtRunner.invoke

    def invoke(self: dbtRunner, args: list[str], **kwargs: object) -> object:
        dbt_runner.write_profile(theirs)  # the other run starts now
        read.append(yaml.safe_load((Path(args[args.index("--profiles-dir") + 1]) / "profiles.yml").read_text()))
        return real_invoke(self, args, **kwargs)

    monkeypatch.setattr(dbtRunner, "invoke", invoke)
    assert dbt_runner.run_dbt(ours, ["parse"])
    assert len(read) == 2  # deps, then parse
    assert all(profile == dbt_runner.profile(ours) for profile in read)
    assert dbt_runner.profile(ours) != dbt_runner.profile(theirs)
    assert yaml.safe_load((tmp_path / "dbt" / "profiles.yml").read_text()) == dbt_runner.profile(theirs)
    assert [path.name for path in (tmp_path / "dbt").iterdir()] == ["profiles.yml"]  # the run's copy is gone


def test_a_command_that_queries_a_running_session_gets_a_profile_without_spark_settings(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Which dbt commands reuse the process's SparkSession, setting the lakehouse's settings once instead of dbt-spark
    before every statement: those that query the session target, and only while a session runs (else dbt starts
    one from the profile's settings)."""
    from types import SimpleNamespace

    from pyspark.sql.session import SparkSession

    import ingest.dbt_runner as dbt_runner
    import ingest.spark

    applied: list[str] = []
    monkeypatch.setattr(ingest.spark, "spark_session", lambda settings, app_name: applied.append(app_name))
    settings = settings_for_target("session")
    cases = {
        ("build",): True,
        ("--debug", "run", "--select", "x"): True,
        ("test", "--target", "session"): True,
        ("run-operation", "m"): True,
        ("parse",): False,
        ("deps",): False,
        ("ls", "--select", "x"): False,
        ("build", "--help"): False,
        ("build", "--target", "cluster"): False,
        ("build", "-t=cluster"): False,
        ("build", "--profile", "theirs"): False,
        # Flags before the command may take values: the command is the first word dbt knows as one.
        ("--target", "session", "build"): True,
        ("--log-level", "debug", "run"): True,
        ("--target", "cluster", "build"): False,
        ("debug",): True,  # tests the connection
        ("docs", "generate"): True,
        ("docs", "serve"): False,
        ("--version",): False,
    }
    monkeypatch.setattr(SparkSession, "_instantiatedSession", None)
    assert not any(dbt_runner._reuse_session(settings, command) for command in cases)
    monkeypatch.setattr(SparkSession, "_instantiatedSession", SimpleNamespace(_sc=SimpleNamespace(_jsc=None)))
    assert not any(dbt_runner._reuse_session(settings, command) for command in cases)  # a stopped one
    assert applied == []
    monkeypatch.setattr(SparkSession, "_instantiatedSession", SimpleNamespace(_sc=SimpleNamespace(_jsc=object())))
    for command, expected in cases.items():
        applied.clear()
        assert dbt_runner._reuse_session(settings, command) is expected, command
        assert applied == (["cdclake-dbt"] if expected else []), command
    cluster = settings_for_target("cluster")
    assert not dbt_runner._reuse_session(cluster, ["build"])
    assert dbt_runner._reuse_session(cluster, ["build", "--target", "session"])
    # Whichever the target: what needs the catalog (and, for the thrift method, its `default` namespace).
    assert dbt_runner.sends_queries([])  # cdclake runs `build`
    assert dbt_runner.sends_queries(["--target", "cluster", "build"])
    assert not dbt_runner.sends_queries(["--target", "cluster", "deps"])


def test_cdclake_dbt_starts_spark_beside_dbt_only_in_a_process_of_its_own(monkeypatch: pytest.MonkeyPatch) -> None:
    """`cdclake dbt build` (the command, ingest.cli.main) starts the SparkSession while dbt imports and parses;
    called from Python (CliRunner here), where a session of the caller's might run, it leaves that to dbt. And
    never for a command that does not query the session target, or with a session running already."""
    import threading
    from types import SimpleNamespace

    from click.testing import CliRunner
    from pyspark.sql.session import SparkSession

    import ingest.dbt_runner as dbt_runner
    import ingest.lakehouse
    import ingest.spark
    from ingest.cli import cli

    started: list[str] = []
    monkeypatch.setattr(ingest.spark, "spark_session", lambda settings, app_name: started.append(app_name))
    monkeypatch.setattr(dbt_runner, "run_dbt", lambda settings, args: True)
    monkeypatch.setattr(SparkSession, "_instantiatedSession", None)
    monkeypatch.setattr(ingest.lakehouse, "check_catalog_reachable", lambda settings: None)  # no lakehouse here

    def started_by(argv: list[str], obj: dict[str, object] | None = None) -> list[str]:
        started.clear()
        result = CliRunner().invoke(cli, ["dbt", *argv], standalone_mode=False, obj=obj)
        assert result.exception is None, result.output
        for thread in threading.enumerate():
            if thread.name == "cdclake-spark-start":
                thread.join(10)
        return list(started)

    assert started_by(["build"]) == []
    assert started_by(["build"], obj={"own_process": True}) == ["cdclake-dbt"]
    assert started_by(["parse"], obj={"own_process": True}) == []
    assert started_by(["build", "--target", "cluster"], obj={"own_process": True}) == []
    monkeypatch.setattr(SparkSession, "_instantiatedSession", SimpleNamespace(_sc=SimpleNamespace(_jsc=object())))
    assert started_by(["build"], obj={"own_process": True}) == []


def settings_for_target(target: str) -> Settings:
    dbt = {"target": target, **({"thrift_host": "127.0.0.1"} if target == "cluster" else {})}
    return Settings.model_validate({"dbt": dbt})


def test_bad_values_fail_at_load_naming_the_key(tmp_path: Path) -> None:
    """A catalog URI that does not parse (a port that is not a number) and a dbt target the profile does not have
    fail when the file loads, naming the key (and never showing the URI, which holds a password)."""
    text = "lakehouse:\n  catalog_uri: postgresql+psycopg2://u:pw-S3cret@db:54x32/iceberg\ndbt:\n  target: prod\n"
    with pytest.raises(ConfigError) as failure:
        load_settings(write(tmp_path, text), environ={})
    message = str(failure.value)
    assert "lakehouse.catalog_uri: Value error, not a valid SQLAlchemy URI" in message
    assert "dbt.target: Input should be 'session' or 'cluster'" in message
    assert "pw-S3cret" not in message


def test_an_unreachable_catalog_database_is_a_named_error(tmp_path: Path) -> None:
    """What the driver says, first line, without the password; not a traceback."""
    from ingest.broker import free_port
    from ingest.errors import CatalogUnavailableError
    from ingest.lakehouse import load_catalog

    uri = f"postgresql+psycopg2://iceberg:pw-S3cret@127.0.0.1:{free_port()}/iceberg"
    settings = load_settings(write(tmp_path, f"lakehouse:\n  catalog_uri: '{uri}'\n"), environ={})
    with pytest.raises(CatalogUnavailableError, match=r"^lakehouse\.catalog_uri: cannot open the Iceberg catalog") as e:
        load_catalog(settings)
    assert "refused" in str(e.value)
    assert "pw-S3cret" not in str(e.value)


def test_config_can_follow_the_subcommand(tmp_path: Path) -> None:
    """`cdclake ingest --config FILE` (the issue's form) as well as `cdclake --config FILE ingest`, for every
    subcommand that reads the configuration; after the subcommand it wins."""
    from click.testing import CliRunner

    from ingest.cli import cli

    bad = write(tmp_path, "ingest:\n  max_recordz: 5\n")
    other = tmp_path / "other.yml"
    other.write_text("ingest:\n  max_records: 5\n")
    runner = CliRunner()
    for command in ("ingest", "status", "scaffold", "maintain", "sql", "dbt-profile", "dbt"):
        result = runner.invoke(cli, [command, "--config", str(bad)], env={"CDCLAKE_CONFIG": str(other)})
        assert isinstance(result.exception, ConfigError), (command, result.output)
        assert str(result.exception) == f"{bad}: ingest.max_recordz: Extra inputs are not permitted"
        result = runner.invoke(cli, ["--config", str(other), command, "--config", str(bad)])
        assert str(result.exception).startswith(f"{bad}: "), (command, result.output)
    # After dbt's own arguments too (click hands everything after the first one to dbt, which has no --config).
    for args in (["build", "--select", "x", "--config", str(bad)], ["build", f"--config={bad}"]):
        result = runner.invoke(cli, ["dbt", *args], env={"CDCLAKE_CONFIG": str(other)})
        assert str(result.exception) == f"{bad}: ingest.max_recordz: Extra inputs are not permitted", args
    result = runner.invoke(cli, ["--log-level", "verbose", "status"])
    assert result.exit_code == 2
    assert "'verbose' is not one of" in result.output


def test_cdclake_dbt_says_why_dbt_did_not_run(tmp_path: Path) -> None:
    """A misspelt dbt command or option fails naming it (dbt returns the error instead of logging it: the command
    exited 1 without a word); a --project-dir among dbt's arguments is the project used, not cdclake's."""
    from click.testing import CliRunner

    from ingest.cli import cli
    from ingest.lakehouse import load_catalog

    project = tmp_path / "project"
    (project / "dbt_packages" / "cdclake").mkdir(parents=True)  # installed: no `dbt deps` first
    config = write(tmp_path, "ingest:\n  max_records: 5\n")
    load_catalog(load_settings(config, environ={}))  # a lakehouse ingest has created (a missing one is refused)
    runner = CliRunner()
    for args, error in (
        (["biuld"], "No such command 'biuld'"),
        (["build", "--slect", "x"], "No such option '--slect'"),
    ):
        argv = ["dbt", *args, "--project-dir", str(project), "--config", str(config)]
        result = runner.invoke(cli, argv, standalone_mode=False)
        assert result.return_value == 1, result.output  # `cdclake`'s exit code (ingest.cli.main)
        assert f"dbt did not run: {error}" in result.output  # the log, on stderr


@pytest.mark.parametrize(
    ("consumer", "named"),
    [
        ({"isolation.level": "read_uncommitted"}, "isolation.level='read_uncommitted': records of aborted"),
        ({"auto.offset.reset": "latest"}, "auto.offset.reset='latest': a partition whose bronze offset"),
        ({"auto.offset.reset": "largest"}, "auto.offset.reset='largest'"),
        ({"enable.partition.eof": "false"}, "enable.partition.eof='false'"),
        ({"topic.auto.offset.reset": "latest"}, "topic.auto.offset.reset='latest'"),
    ],
)
def test_consumer_settings_that_break_exactly_once_are_refused(
    tmp_path: Path, consumer: dict[str, str], named: str
) -> None:
    """librdkafka settings passed through under source.consumer: aborted transactions landed, a silent jump to the
    end of a partition, a --once that never ends. Refused at load, naming the setting and why."""
    path = write(tmp_path, yaml.safe_dump({"source": {"type": "kafka", "topics": ["a"], "consumer": consumer}}))
    with pytest.raises(ConfigError, match=re.escape(named)):
        load_settings(path, environ={})
    fine = {"isolation.level": "READ_COMMITTED", "auto.offset.reset": "earliest", "enable.partition.eof": "1"}
    path = write(tmp_path, yaml.safe_dump({"source": {"type": "kafka", "topics": ["a"], "consumer": fine}}))
    assert load_settings(path, environ={}).require_source().consumer_config() == fine


@pytest.mark.parametrize("pattern", [r"^dbserver\d\..*", r"^db\D+\.x", r"(?i)^dbserver1\..*", r"^a(?!b).*"])
def test_a_topic_pattern_librdkafka_cannot_match_is_refused(tmp_path: Path, pattern: str) -> None:
    """librdkafka subscribes with a POSIX extended regex (glibc's, with GNU's \\w and \\s): `\\d` matched no topic
    (and --once blamed the consumer group after minutes), a lookahead or inline flag failed the subscription with
    librdkafka's bare error."""
    path = write(tmp_path, yaml.safe_dump({"source": {"type": "kafka", "topic_pattern": pattern}}))
    with pytest.raises(ConfigError, match=r"source\.topic_pattern: .*POSIX extended regex"):
        load_settings(path, environ={})
    for fine in (r"^dbserver[0-9]\..*", r"^db1\.inventory\.\w+$", r"^a\\d"):  # GNU's \w; an escaped backslash
        path = write(tmp_path, yaml.safe_dump({"source": {"type": "kafka", "topic_pattern": fine}}))
        assert load_settings(path, environ={}).require_source().topic_pattern == fine


def test_the_demo_writes_a_config_its_suggested_commands_can_use(tmp_path: Path) -> None:
    """`make demo` suggests `cdclake --config lakehouse/cdclake-demo.yml ...`: that file must name the demo's dbt
    project, or `cdclake dbt` looked for one beside the file (`lakehouse/dbt_project`) and found none."""
    from ingest.dbt_runner import project_dir
    from ingest.demo import demo_settings

    project = tmp_path / "dbt_project"
    demo_settings(tmp_path / "lakehouse", "127.0.0.1:9092", ["server1.transaction"], project)
    written = load_settings(tmp_path / "lakehouse" / "cdclake-demo.yml", environ={})
    assert project_dir(written) == project
    assert written.lakehouse.warehouse == str(tmp_path / "lakehouse" / "warehouse")


def test_the_demos_driver_compiles_with_c1_and_keeps_the_shipped_java_options(tmp_path: Path) -> None:
    """The demo's builds are a few hundred changes each: its driver runs the JIT of short runs. Its Java options
    replace the shipped ones (a setting of cdclake.yml overrides spark_conf/), so they must carry the shipped ones
    too: without `-Duser.timezone=UTC` the JVM would read and write timestamps in the machine's zone."""
    from ingest.demo import demo_settings
    from ingest.jvm_archive import driver_spark_conf
    from ingest.lakehouse import EMBEDDED_SPARK_CONF, read_spark_defaults
    from ingest.spark import SHORT_RUN_JIT_OPTIONS

    demo_settings(tmp_path / "lakehouse", "127.0.0.1:9092", ["server1.transaction"], tmp_path / "dbt_project")
    written = load_settings(tmp_path / "lakehouse" / "cdclake-demo.yml", environ={})
    options = driver_spark_conf(written)["spark.driver.extraJavaOptions"].split()
    shipped = read_spark_defaults(EMBEDDED_SPARK_CONF)["spark.driver.extraJavaOptions"]
    assert "-Duser.timezone=UTC" in shipped.split()
    for option in [*shipped.split(), *SHORT_RUN_JIT_OPTIONS.split()]:
        assert option in options
    assert "-XX:TieredStopAtLevel=1" in options
    assert any(option.startswith("-Dlog4j2.configurationFile=") for option in options)


@pytest.mark.parametrize(
    ("uri", "message"),
    [
        ("postgres://iceberg:S3cretPw99@db/iceberg", r"catalog database 'postgres' is not supported: use sqlite"),
        ("mysql://iceberg:S3cretPw99@db/iceberg", r"catalog database 'mysql' is not supported"),
        ("postgresql+pg8000://iceberg:S3cretPw99@db/iceberg", r"PostgreSQL driver 'pg8000' is not supported"),
        (
            "postgresql+psycopg2://iceberg:Sec@ret99@db/iceberg",
            r"the part before the host holds more than one '@': percent-encode an '@' .* %40",
        ),
        ("postgresql+psycopg2://iceberg:S3cretPw99@db:5432", r"name the catalog's database after the host"),
        ("postgresql://iceberg:S3cretPw99@db/", r"name the catalog's database after the host"),
        ("sqlite://", r"an in-memory SQLite catalog is not shared with Spark"),
        ("sqlite:///:memory:", r"an in-memory SQLite catalog"),
    ],
)
def test_a_catalog_uri_cdclake_cannot_use_is_named_at_load(tmp_path: Path, uri: str, message: str) -> None:
    """Each of these failed later: a traceback from SQLAlchemy (an unknown dialect or a driver not installed), a
    host name holding the end of the password (an unencoded '@'), a catalog each connection saw empty, or (no
    database) pyiceberg and Spark in different databases: libpq takes the user's name, Spark's URL said `None`."""
    with pytest.raises(ConfigError, match=rf"lakehouse\.catalog_uri: Value error, {message}") as failure:
        load_settings(write(tmp_path, f"lakehouse:\n  catalog_uri: '{uri}'\n"), environ={})
    assert "S3cretPw99" not in str(failure.value)
    assert "ret99" not in str(failure.value)


def test_a_bare_postgresql_uri_gets_the_installed_driver(tmp_path: Path) -> None:
    """SQLAlchemy 2.1 reads postgresql:// as psycopg 3, which cdclake does not install; pyiceberg gets psycopg2."""
    from ingest.lakehouse import pyiceberg_uri

    settings = load_settings(write(tmp_path, "lakehouse:\n  catalog_uri: postgresql://iceberg:pw%40x@db/cat\n"), {})
    assert pyiceberg_uri(settings) == "postgresql+psycopg2://iceberg:pw%40x@db/cat"


def test_an_empty_bootstrap_servers_is_named(tmp_path: Path) -> None:
    """An empty value (a variable set to nothing) left the client no broker to ask: --once waited 5 minutes."""
    path = write(tmp_path, "source:\n  topics: [t]\n")
    with pytest.raises(ConfigError, match=r"source\.bootstrap_servers is empty"):
        load_settings(path, environ={"CDCLAKE__SOURCE__BOOTSTRAP_SERVERS": ""})


def test_folders_and_ports_that_cannot_be_used_name_their_setting(tmp_path: Path) -> None:
    """A warehouse or SQLite catalog folder that cannot be created, and a metrics port in use, printed a Python
    traceback (exit status 1)."""
    import socket

    from ingest.lakehouse import catalog_properties
    from ingest.metrics import IngestMetrics, MetricsServer

    blocked = tmp_path / "a-file"
    blocked.write_text("")
    settings = load_settings(write(tmp_path, f"lakehouse:\n  warehouse: {blocked}/wh\n"), environ={})
    with pytest.raises(ConfigError, match=rf"^lakehouse\.warehouse: cannot create the warehouse folder {blocked}/wh"):
        catalog_properties(settings)
    text = f"lakehouse:\n  warehouse: {tmp_path}/wh\n  catalog_uri: sqlite:///{blocked}/catalog.db\n"
    with pytest.raises(ConfigError, match=r"^lakehouse\.catalog_uri: cannot create the SQLite catalog's folder"):
        catalog_properties(load_settings(write(tmp_path, text), environ={}))
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(ConfigError, match=rf"^ingest\.metrics_port: cannot serve on .*:{port}: "):
            MetricsServer(IngestMetrics(), port, 60.0, host="127.0.0.1")


def test_a_missing_sqlite_catalog_is_refused_by_every_command_but_ingest_and_demo(tmp_path: Path) -> None:
    """A mistyped SQLite catalog path: maintain, sql, scaffold and dbt created an empty catalog there (status
    already refused it). Every one now fails naming the setting and the path, before Spark starts."""
    from click.testing import CliRunner

    from ingest.cli import cli
    from ingest.lakehouse import check_catalog_reachable, load_catalog

    typo = tmp_path / "x" / "catalg.db"
    project = Path(__file__).resolve().parent.parent / "dbt_project"  # the reference project, for scaffold
    config = write(
        tmp_path,
        f"lakehouse:\n  warehouse: {tmp_path}/wh\n  catalog_uri: sqlite:///{typo}\ndbt:\n  project_dir: {project}\n",
    )
    message = rf"^lakehouse\.catalog_uri: no catalog database at {re.escape(str(typo))}: "
    for args in (
        ["maintain"],
        ["maintain", "--dry-run"],
        ["scaffold"],
        ["sql", "SELECT 1"],
        ["dbt", "build"],
        ["status", "--no-lag"],
    ):
        result = CliRunner().invoke(cli, ["--config", str(config), *args])
        assert isinstance(result.exception, ConfigError), (args, result.output, result.exception)
        assert re.match(message, str(result.exception)), (args, str(result.exception))
        assert not typo.exists(), args
        assert not typo.parent.exists(), args
    # dbt's thrift method: the Thrift Server's namespace check created the catalog before dbt connected.
    (tmp_path / "thrift").mkdir()
    thrift = write(
        tmp_path / "thrift",
        f"lakehouse:\n  warehouse: {tmp_path}/wh\n  catalog_uri: sqlite:///{typo}\n"
        f"dbt:\n  project_dir: {project}\n  target: cluster\n  thrift_host: 127.0.0.1\n",
    )
    for args in (["dbt"], ["dbt", "run"], ["dbt", "--debug", "test"]):
        result = CliRunner().invoke(cli, ["--config", str(thrift), *args])
        assert isinstance(result.exception, ConfigError), (args, result.output, result.exception)
        assert re.match(message, str(result.exception)), (args, str(result.exception))
        assert not typo.parent.exists(), args
    settings = load_settings(config, environ={})
    with pytest.raises(ConfigError, match=message):
        check_catalog_reachable(settings)
    with pytest.raises(ConfigError, match=message):
        load_catalog(settings, create=False)
    assert not typo.exists()
    load_catalog(settings)  # ingest and demo create it
    assert typo.is_file()
    check_catalog_reachable(settings)


@pytest.mark.parametrize(
    ("uri", "reason"),
    [
        # psycopg2 refuses the DSN (ProgrammingError), before any connection.
        ("postgresql+psycopg2://u:pw-S3cret-77@127.0.0.1:1/db?sslmod=require", 'invalid connection option "sslmod"'),
        ("sqlite:///{not_a_database}", "file is not a database"),  # DatabaseError
    ],
)
def test_catalog_database_errors_other_than_operational_are_named(tmp_path: Path, uri: str, reason: str) -> None:
    """Not only OperationalError (refused): a bad connection parameter and a file that is no database escaped as
    tracebacks (and a ProgrammingError was retried as if another process were creating the tables)."""
    import time

    from ingest.errors import CatalogUnavailableError
    from ingest.lakehouse import check_catalog_reachable, load_catalog

    not_a_database = tmp_path / "notes.txt"
    not_a_database.write_text("these are my notes, not a database\n" * 200)
    uri = uri.format(not_a_database=not_a_database)
    settings = load_settings(write(tmp_path, f"lakehouse:\n  warehouse: {tmp_path}/wh\n  catalog_uri: '{uri}'\n"), {})
    for open_catalog in (load_catalog, check_catalog_reachable):
        started = time.monotonic()
        with pytest.raises(CatalogUnavailableError, match=r"^lakehouse\.catalog_uri: cannot open the Iceberg") as e:
            open_catalog(settings)
        assert reason in str(e.value), open_catalog
        assert "pw-S3cret-77" not in str(e.value)
        assert time.monotonic() - started < 0.5, "retried what is no race"


def test_spark_jars_of_the_configuration_add_to_cdclakes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """docs/scaling.md: hadoop-aws through spark.jars in spark.conf. It replaced cdclake's list, the Iceberg runtime
    with it; it is appended now, without duplicates."""
    from ingest.lakehouse import RUNTIME_DIR_ENV, spark_conf

    runtime = tmp_path / "runtime"
    (runtime / "jars").mkdir(parents=True)
    ours = [f"{runtime}/jars/iceberg-spark-runtime.jar", f"{runtime}/jars/sqlite-jdbc.jar"]
    (runtime / "jars" / "classpath.txt").write_text(",".join(ours) + "\n")
    monkeypatch.setenv(RUNTIME_DIR_ENV, str(runtime))
    text = f"""
lakehouse:
  warehouse: {tmp_path}/wh
  catalog_uri: sqlite:///{tmp_path}/catalog.db
spark:
  conf:
    spark.jars: /opt/hadoop-aws-3.3.4.jar, {ours[1]},/opt/aws-java-sdk-bundle.jar
"""
    conf = spark_conf(load_settings(write(tmp_path, text), environ={}))
    assert conf["spark.jars"].split(",") == [*ours, "/opt/hadoop-aws-3.3.4.jar", "/opt/aws-java-sdk-bundle.jar"]
    without = spark_conf(load_settings(write(tmp_path, f"lakehouse:\n  warehouse: {tmp_path}/wh\n"), environ={}))
    assert without["spark.jars"].split(",") == ours


def test_bronze_and_silver_namespaces_must_differ() -> None:
    """Scaffold names a silver model after its bronze table: with one namespace for both, a model's target would be
    its own bronze table, which the materialization would then alter and delete from."""
    with pytest.raises(ConfigError, match=r"bronze_namespace and lakehouse\.silver_namespace are both 'lake'"):
        load_settings(
            None,
            environ={"CDCLAKE__LAKEHOUSE__BRONZE_NAMESPACE": "lake", "CDCLAKE__LAKEHOUSE__SILVER_NAMESPACE": "lake"},
        )
    assert load_settings(None, environ={"CDCLAKE__LAKEHOUSE__SILVER_NAMESPACE": "gold"}).lakehouse.silver_namespace


def test_heartbeat_topic_prefixes_are_a_list_of_names() -> None:
    environ = {"CDCLAKE__SOURCE__TOPICS": '["a"]'}
    prefixes = {"CDCLAKE__SOURCE__HEARTBEAT_TOPIC_PREFIXES": '["hb", "x.hb"]'}
    source = load_settings(None, environ={**environ, **prefixes}).source
    assert source is not None
    assert source.heartbeat_topic_prefixes == ["hb", "x.hb"]
    default = load_settings(None, environ=environ).source
    assert default is not None
    assert default.heartbeat_topic_prefixes == []
    with pytest.raises(ConfigError, match=r"source\.heartbeat_topic_prefixes.*an empty prefix would take every topic"):
        load_settings(None, environ={**environ, "CDCLAKE__SOURCE__HEARTBEAT_TOPIC_PREFIXES": '["hb", " "]'})


@pytest.mark.parametrize(
    ("spark", "local"),
    [
        ({}, True),
        ({"master": "local[*]"}, True),
        ({"master": "spark://spark-master:7077"}, False),
        ({"master": "local[2]", "conf": {"spark.master": "k8s://https://kubernetes.default.svc:443"}}, False),
        ({"master": "yarn", "conf": {"spark.sql.shuffle.partitions": "64"}}, False),
    ],
)
def test_a_local_masters_settings_stay_off_a_cluster(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, spark: dict[str, object], local: bool
) -> None:
    """The embedded default's 4 shuffle partitions and loopback driver (spark_conf/local.conf, SPARK_LOCAL_IP)
    capped every shuffle of a cluster at 4 tasks and gave its executors a driver address they cannot reach."""
    from ingest import dbt_runner
    from ingest.lakehouse import spark_conf

    monkeypatch.delenv("SPARK_LOCAL_IP", raising=False)
    text = yaml.safe_dump({"lakehouse": {"warehouse": f"{tmp_path}/wh"}, "spark": spark})
    settings = load_settings(write(tmp_path, text), environ={})
    conf = spark_conf(settings)
    loopback = {"spark.driver.host": "127.0.0.1", "spark.driver.bindAddress": "127.0.0.1"}
    if local:
        assert conf.items() >= {"spark.sql.shuffle.partitions": "4", "spark.default.parallelism": "2"}.items()
        assert conf.items() >= loopback.items()
        assert dbt_runner.dbt_environment(settings)["SPARK_LOCAL_IP"] == "127.0.0.1"
    else:
        assert not conf.keys() & {"spark.default.parallelism", *loopback}
        # Spark's own default (200, which adaptive execution coalesces), or the user's.
        assert conf.get("spark.sql.shuffle.partitions") == settings.spark.conf.get("spark.sql.shuffle.partitions")
        assert "SPARK_LOCAL_IP" not in dbt_runner.dbt_environment(settings)
    assert conf["spark.sql.adaptive.enabled"] == "true"  # every master
    monkeypatch.setenv("SPARK_LOCAL_IP", "10.0.0.5")  # the user's own wins
    assert "SPARK_LOCAL_IP" not in dbt_runner.dbt_environment(settings)


def test_a_local_warehouse_with_a_cluster_master_is_warned_about(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Executors on other hosts would write their data files to their own disks. A warning, not an error: a
    one-host cluster, or a path every node mounts, works."""
    from ingest.lakehouse import local_warehouse_on_cluster
    from ingest.spark import prepare_driver_process

    def settings(warehouse: str, master: str) -> Settings:
        text = yaml.safe_dump({"lakehouse": {"warehouse": warehouse}, "spark": {"master": master}})
        return load_settings(write(tmp_path, text), environ={})

    assert local_warehouse_on_cluster(settings(f"{tmp_path}/wh", "local[2]")) is None
    assert local_warehouse_on_cluster(settings("s3a://lake/wh", "spark://spark-master:7077")) is None
    cluster = settings(f"{tmp_path}/wh", "spark://spark-master:7077")
    message = local_warehouse_on_cluster(cluster)
    assert message is not None
    assert message.startswith(f"lakehouse.warehouse is a local path (file://{tmp_path}/wh) and spark.master is ")
    monkeypatch.setenv("TZ", "UTC")  # restored afterwards: prepare_driver_process sets it
    with caplog.at_level(logging.WARNING, logger="ingest.spark"):
        prepare_driver_process(cluster)
        prepare_driver_process(cluster)
    assert [r.getMessage() for r in caplog.records if r.name == "ingest.spark"] == [message]  # once
