"""`cdclake sql`, `cdclake status` and `cdclake maintain`: output formats, freshness, and upkeep that keeps offsets."""

from __future__ import annotations

import csv
import datetime as dt
import io
import logging
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, cast

import orjson
import pyarrow as pa
import pytest
from click.testing import CliRunner, Result
from pyiceberg.table.snapshots import Operation

from ingest.broker import Record, TansuBroker
from ingest.bronze.naming import DEAD_LETTER_TABLE
from ingest.bronze.tables import OFFSETS_PROPERTY, BronzeTables, decode_offsets
from ingest.cli import cli
from ingest.cli.sql_cmd import CONTINUATION, PROMPT, all_statements, jsonable, repl, split_statements, text_value
from ingest.config import LayerMaintenance, MaintenanceSettings, Settings
from ingest.lakehouse import load_catalog
from ingest.maintenance import (
    plan_maintenance,
    protected_position,
    spark_error_line,
    timestamp_literal,
)
from ingest.snapshots import (
    APPLIED_RECORDS_PROPERTY,
    APPLIED_SNAPSHOT_PROPERTY,
    HELD_TRANSACTIONS_PROPERTY,
    ancestors,
    silver_positions,
)
from ingest.status import (
    PartitionStatus,
    Watermarks,
    apply_watermarks,
    collect_status,
    stale_problems,
    status_document,
)
from tests.conftest import FIXTURES, ingest_file, make_settings, topic_counts
from tests.kafka_fixtures import ONE_RECORD_BATCHES, broker, kafka_settings, publish, run_kafka, unique  # noqa: F401 - the session broker
from tests.spark_fixtures import SparkLakehouse
from tests.test_bronze_file import write_dump

PG_DUMP = FIXTURES / "debezium" / "postgres" / "dbserver1.jsonl"
CUSTOMERS = "dbserver1_inventory_customers"
CUSTOMERS_TOPIC = "dbserver1.inventory.customers"


# -- helpers ----------------------------------------------------------------------------------------------------------
def extended_dump(path: Path, extra: int) -> Path:
    """The Postgres dump plus ``extra`` more customer changes at the next offsets (a stream that moved on)."""
    lines = PG_DUMP.read_bytes().splitlines()
    last = max(
        (orjson.loads(line) for line in lines if orjson.loads(line)["topic"] == CUSTOMERS_TOPIC),
        key=lambda item: item["offset"],
    )
    more = [orjson.dumps({**last, "offset": last["offset"] + 1 + i}) for i in range(extra)]
    path.write_bytes(b"\n".join([*lines, *more]) + b"\n")
    return path


def invoke(args: list[str], input: str | None = None) -> Result:
    """Run the CLI in process; the group reconfigures logging onto CliRunner's streams, so restore it after."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    try:
        return CliRunner().invoke(cli, args, input=input, catch_exceptions=False)
    finally:
        root.handlers[:] = handlers
        root.setLevel(level)


def scan_rows(settings: Settings, identifier: str) -> int:
    return int(load_catalog(settings).load_table(identifier).scan().to_arrow().num_rows)


def bronze_offsets(settings: Settings) -> dict[str, Any]:
    catalog = load_catalog(settings)
    namespace = settings.lakehouse.bronze_namespace
    return {
        name: decode_offsets(catalog.load_table(f"{namespace}.{name}").properties.get(OFFSETS_PROPERTY))
        for name in BronzeTables(catalog, namespace).list_tables()
    }


def make_silver(settings: Settings, name: str, applied_snapshot: int, applied_at: dt.datetime) -> None:
    """A silver table as the cdc_silver materialization leaves it (metadata columns, the applied bronze snapshot and
    bronze's row count there)."""
    catalog = load_catalog(settings)
    applied = catalog.load_table(f"{settings.lakehouse.bronze_namespace}.{name}").snapshot_by_id(applied_snapshot)
    assert applied is not None
    assert applied.summary is not None
    applied_records = applied.summary["total-records"]
    namespace = settings.lakehouse.silver_namespace
    catalog.create_namespace_if_not_exists(namespace)
    schema = pa.schema(
        [
            pa.field("id", pa.int64()),
            pa.field("_cdc_order", pa.list_(pa.int64())),
            pa.field("_cdc_op", pa.string()),
            pa.field("_cdc_offset", pa.int64()),
            pa.field("_cdc_source_ts", pa.timestamp("us", tz="UTC")),
            pa.field("_cdc_applied_at", pa.timestamp("us", tz="UTC")),
        ]
    )
    table = catalog.create_table(f"{namespace}.{name}", schema=schema)
    table.append(
        pa.Table.from_pylist(
            [
                {
                    "id": 1,
                    "_cdc_order": [1],
                    "_cdc_op": "c",
                    "_cdc_offset": 0,
                    "_cdc_source_ts": applied_at,
                    "_cdc_applied_at": applied_at - dt.timedelta(minutes=5),
                },
                {
                    "id": 2,
                    "_cdc_order": [2],
                    "_cdc_op": "u",
                    "_cdc_offset": 1,
                    "_cdc_source_ts": applied_at,
                    "_cdc_applied_at": applied_at,
                },
            ],
            schema=schema,
        )
    )
    with table.transaction() as transaction:
        transaction.set_properties(
            {APPLIED_SNAPSHOT_PROPERTY: str(applied_snapshot), APPLIED_RECORDS_PROPERTY: str(applied_records)}
        )


# -- the command group ------------------------------------------------------------------------------------------------
def test_help_lists_every_subcommand_and_a_command_imports_only_what_it_uses() -> None:
    from ingest.cli import SUBCOMMANDS

    listed = invoke(["--help"]).stdout
    for name in SUBCOMMANDS:
        assert f"  {name} " in listed, name
    # In a fresh interpreter: `cdclake dbt` resolves its command without the ingest pipeline (pyiceberg, pyarrow).
    code = (
        "import sys, click; from ingest.cli import cli; "
        "assert isinstance(cli.get_command(click.Context(cli), 'dbt'), click.Command); "
        "print('ingest.pipeline' in sys.modules)"
    )
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    assert loaded.stdout.strip() == "False"


# -- sql: statements and values (no Spark) ----------------------------------------------------------------------------
def test_statements_split_on_semicolons_outside_quotes_and_comments() -> None:
    text = "select ';' as a, \"x;y\" as `b;c`; -- not; here\nselect 2 /* ; */;\n  select 3"
    statements, rest = split_statements(text)
    assert statements == ["select ';' as a, \"x;y\" as `b;c`", "-- not; here\nselect 2 /* ; */"]
    assert rest.strip() == "select 3"
    assert split_statements("select 'it\\'s;' ;")[0] == ["select 'it\\'s;'"]
    assert split_statements(";;  -- only a comment;\n")[0] == []
    assert split_statements("  -- only a comment\n") == ([], "")
    assert all_statements("select 1; select 2") == ["select 1", "select 2"]
    # Spark SQL's bracketed comments nest; in a raw string a backslash escapes nothing.
    assert all_statements("select 1 /* a /* b */ ; c */; select 2") == ["select 1 /* a /* b */ ; c */", "select 2"]
    assert split_statements("/* a /* b */ ; */") == ([], "")
    assert all_statements("select r'\\'; select R\"\\\"; select 2") == ["select r'\\'", 'select R"\\"', "select 2"]
    assert all_statements("select color'\\'; x'") == ["select color'\\'; x'"]  # not raw: the quote is escaped


def test_values_render_for_scripts() -> None:
    from decimal import Decimal

    from pyspark.sql import Row

    value = Row(a=1, b=[Decimal("1.50"), None], c={"k": b"\x01\x02"}, d=dt.datetime(2024, 1, 2, 3, 4, 5))
    assert jsonable(value) == {"a": 1, "b": ["1.50", None], "c": {"k": "AQI="}, "d": "2024-01-02T03:04:05"}
    assert text_value(value) == '{"a":1,"b":["1.50",null],"c":{"k":"AQI="},"d":"2024-01-02T03:04:05"}'
    assert text_value(None) == ""
    assert text_value(True) == "true"
    assert text_value(dt.datetime(2024, 1, 2, 3, 4, 5)) == "2024-01-02 03:04:05"


def test_prompt_runs_statements_as_they_end_and_survives_errors() -> None:
    lines = iter(["select 1;", "select", "  2; select 3", ";", "bad;", "exit", "select 99;"])
    prompts: list[str] = []
    ran: list[str] = []
    errors: list[str] = []

    def read(prompt: str) -> str:
        prompts.append(prompt)
        return next(lines)

    def run(statement: str) -> None:
        if statement == "bad":
            raise RuntimeError("boom")
        ran.append(statement)

    repl(run, read, lambda exc: errors.append(str(exc)), lambda _text: None)
    assert ran == ["select 1", "select\n  2", "select 3"]
    assert errors == ["boom"]
    assert prompts == [PROMPT, PROMPT, CONTINUATION, CONTINUATION, PROMPT, PROMPT]  # stopped at exit


def test_prompt_quits_on_ctrl_d_and_ctrl_c_discards_the_statement() -> None:
    events: list[Any] = ["select", KeyboardInterrupt(), "select 1;", EOFError()]
    ran: list[str] = []

    def read(_prompt: str) -> str:
        event = events.pop(0)
        if isinstance(event, BaseException):
            raise event
        return str(event)

    out: list[str] = []
    repl(ran.append, read, lambda exc: None, out.append)
    assert ran == ["select 1"]
    assert out == ["^C\n", "\n"]


# -- status (no Spark) ---------------------------------------------------------------------------------------------
@pytest.fixture
def landed(lakehouse: Path) -> Settings:
    settings = make_settings(lakehouse)
    first = ingest_file(settings, PG_DUMP, max_records=7)  # several bronze commits per table
    assert first.stats.flushes > 1
    return settings


def test_status_json_reports_rows_offsets_dead_letters_and_silver(landed: Settings) -> None:
    settings = landed
    catalog = load_catalog(settings)
    bronze = catalog.load_table(f"bronze.{CUSTOMERS}")
    snapshots = sorted(bronze.snapshots(), key=lambda s: s.timestamp_ms)
    assert len(snapshots) >= 3
    # One silver table up to date, one that applied only the second bronze commit.
    make_silver(settings, CUSTOMERS, snapshots[1].snapshot_id, dt.datetime(2024, 5, 6, 7, 8, 9, tzinfo=dt.UTC))
    transactions = catalog.load_table("bronze.dbserver1_transaction")
    assert transactions.current_snapshot() is not None
    make_silver(
        settings,
        "dbserver1_transaction",
        transactions.current_snapshot().snapshot_id,
        dt.datetime.now(dt.UTC),
    )

    result = invoke(["--config", str(Path(settings.base_dir) / "cdclake.yml"), "status", "--json"])
    assert result.exit_code == 0, result.output
    document = orjson.loads(result.stdout)
    tables = {t["name"]: t for t in document["tables"]}
    counts = topic_counts(PG_DUMP)
    assert set(tables) == {CUSTOMERS, "dbserver1_inventory_typed_values", "dbserver1_transaction"}
    assert DEAD_LETTER_TABLE not in tables

    customers = tables[CUSTOMERS]
    assert customers["rows"] == counts[CUSTOMERS_TOPIC]
    assert customers["offsets"] == [
        {
            "topic": CUSTOMERS_TOPIC,
            "partition": 0,
            "next_offset": counts[CUSTOMERS_TOPIC],
            "high_watermark": None,
            "lag": None,
            "lag_error": None,
            "log_start": None,
        }
    ]
    assert customers["last_commit_from"] == "snapshot"
    last = dt.datetime.fromisoformat(customers["last_commit"].replace("Z", "+00:00"))
    assert last == dt.datetime.fromtimestamp(snapshots[-1].timestamp_ms / 1000, tz=dt.UTC)
    assert customers["dead_letters"] == {}
    silver = customers["silver"]
    assert silver["table"] == f"silver.{CUSTOMERS}"
    assert silver["applied_bronze_snapshot_id"] == snapshots[1].snapshot_id
    assert silver["behind"] is True
    since = dt.datetime.fromisoformat(silver["behind_since"].replace("Z", "+00:00"))
    assert since == dt.datetime.fromtimestamp(snapshots[2].timestamp_ms / 1000, tz=dt.UTC)
    assert silver["applied_at_max"] == "2024-05-06T07:08:09Z"

    assert tables["dbserver1_transaction"]["silver"]["behind"] is False
    assert tables["dbserver1_inventory_typed_values"]["silver"] is None
    # The two recorded rows with an oversized numeric are dead letters of their topic.
    assert tables["dbserver1_inventory_typed_values"]["dead_letters"] == {"dbserver1.inventory.typed_values": 2}
    # And why the last of them is one (the dead-letter table holds each reason).
    dead = catalog.load_table(f"bronze.{DEAD_LETTER_TABLE}").scan().to_arrow().sort_by("_cdc_offset").to_pylist()
    last = dead[-1]
    assert tables["dbserver1_inventory_typed_values"]["dead_letters_latest_error"] == {
        "dbserver1.inventory.typed_values": f"{last['_cdc_error_kind']}: {last['_cdc_error']}"
    }
    assert "numeric" in last["_cdc_error"] or "decimal" in last["_cdc_error"], last["_cdc_error"]
    assert customers["dead_letters_latest_error"] == {}
    assert document["dead_letters_without_table_latest_error"] == {}
    assert document["source"] is None
    assert document["lag_checked"] is False
    assert document["stale"] is False
    assert document["problems"] == []

    # Only the named tables (the dead-letter scan is filtered to them).
    only = orjson.loads(
        invoke(["--config", str(Path(settings.base_dir) / "cdclake.yml"), "status", "--json", CUSTOMERS]).stdout
    )
    assert [t["name"] for t in only["tables"]] == [CUSTOMERS]


def test_a_table_name_that_does_not_exist_is_an_error(
    landed: Settings, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`status TABLE` and `maintain --table TABLE` with a name that is not a table (a typo, the namespace left in)
    fail naming it, exit code 2, instead of showing or doing nothing."""
    from ingest.cli import main

    config = str(Path(landed.base_dir) / "cdclake.yml")
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    try:
        for args, wrong in (
            (["status", "--no-lag", "bronze.customers"], "bronze.customers"),
            (["maintain", "--dry-run", "--table", "custmers"], "custmers"),
        ):
            monkeypatch.setattr("sys.argv", ["cdclake", "--config", config, *args])
            with pytest.raises(SystemExit) as failure:
                main()
            assert failure.value.code == 2, args
            assert wrong in capsys.readouterr().err
    finally:
        root.handlers[:] = handlers
        root.setLevel(level)


def test_status_exits_3_when_bronze_is_stale_or_silver_behind_too_long(landed: Settings) -> None:
    settings = landed
    config = str(Path(settings.base_dir) / "cdclake.yml")
    fresh = invoke(["--config", config, "status"])
    assert fresh.exit_code == 0, fresh.output
    assert CUSTOMERS in fresh.stdout
    assert "fresh" in fresh.stdout

    time.sleep(0.05)
    stale = invoke(["--config", config, "status", "--stale-after", "0"])
    assert stale.exit_code == 3
    assert f"bronze.{CUSTOMERS}: last commit" in stale.stderr
    assert "older than 0s" in stale.stderr
    as_json = invoke(["--config", config, "status", "--json", "--stale-after", "0"])
    assert as_json.exit_code == 3
    assert orjson.loads(as_json.stdout)["stale"] is True

    # Silver: behind since bronze's third commit. Fresh bronze, silver behind for longer than allowed -> stale.
    catalog = load_catalog(settings)
    snapshots = sorted(catalog.load_table(f"bronze.{CUSTOMERS}").snapshots(), key=lambda s: s.timestamp_ms)
    make_silver(settings, CUSTOMERS, snapshots[1].snapshot_id, dt.datetime.now(dt.UTC))
    status = collect_status(settings)
    behind_since = dt.datetime.fromtimestamp(snapshots[2].timestamp_ms / 1000, tz=dt.UTC)
    last_commit = dt.datetime.fromtimestamp(snapshots[-1].timestamp_ms / 1000, tz=dt.UTC)
    window = (last_commit - behind_since).total_seconds()
    assert window > 0
    assert stale_problems(status, 3600, now=last_commit + dt.timedelta(seconds=1)) == []
    # (other tables' last commits may lie further back than window / 2: only look at customers)
    problems = [p for p in stale_problems(status, window / 2, now=last_commit) if CUSTOMERS in p]
    assert problems == [
        f"silver.{CUSTOMERS}: behind bronze.{CUSTOMERS} for {int(window)}s, longer than {window / 2:g}s"
    ]


def test_ancestors_walk_the_lineage_as_pyiceberg_does(landed: Settings) -> None:
    from pyiceberg.table.snapshots import ancestors_of

    table = load_catalog(landed).load_table(f"bronze.{CUSTOMERS}")
    walked = [s.snapshot_id for s in ancestors(table)]
    assert len(walked) > 2
    assert walked == [s.snapshot_id for s in ancestors_of(table.current_snapshot(), table.metadata)]


def test_dead_letters_at_a_partitions_end_are_not_lag(lakehouse: Path) -> None:
    """The data table's offset moves only with a record of its own: when a partition's latest records were dead
    letters, status takes the dead-letter table's offset, so they do not show as lag forever."""
    settings = make_settings(lakehouse)
    source = {"connector": "informix", "commit_lsn": "5", "change_lsn": "5"}
    good = [("i.s.t", n, {"id": n}, {"op": "c", "after": {"id": n}, "source": source}) for n in range(10)]
    ingest_file(settings, write_dump(lakehouse / "good.jsonl", good))
    bad = [("i.s.t", n, {"id": n}, "{not json") for n in (10, 11)]
    ingest_file(settings, write_dump(lakehouse / "bad.jsonl", bad))
    status = collect_status(settings, watermarks=lambda asked: dict.fromkeys(asked, Watermarks(0, 12)))
    [table] = status.tables
    assert table.dead_letters == {"i.s.t": 2}
    assert [(p.next_offset, p.lag) for p in table.partitions] == [(12, 0)]
    # As after a data commit that failed once its flush's dead letters were committed: 12-13 never landed, 14 is a
    # dead letter. Only the consecutive dead letters count as landed.
    ingest_file(settings, write_dump(lakehouse / "gap.jsonl", [("i.s.t", 14, {"id": 14}, "{not json")]))
    status = collect_status(settings, watermarks=lambda asked: dict.fromkeys(asked, Watermarks(0, 15)))
    assert [(p.next_offset, p.lag) for p in status.tables[0].partitions] == [(12, 3)]


def test_a_partition_or_topic_of_dead_letters_only_is_shown(lakehouse: Path) -> None:
    """A partition whose every record was a dead letter has no offset in its data table: status shows it, where
    the dead-letter table says, and asks its lag. A topic whose every record was a dead letter has no bronze
    table: status counts it as stale instead of calling the lakehouse fresh."""
    settings = make_settings(lakehouse)
    source = {"connector": "informix", "commit_lsn": "5", "change_lsn": "5"}
    good = ("i.s.t", 0, {"id": 0}, {"op": "c", "after": {"id": 0}, "source": source})
    bad = [("i.s.t", n, {"id": n}, "{not json") for n in (3, 4)]  # partition 1; offsets 0-2 gone by retention
    ingest_file(settings, write_dump(lakehouse / "mixed.jsonl", [good, *bad], partitions=[0, 1, 1]))
    status = collect_status(settings, watermarks=lambda asked: dict.fromkeys(asked, Watermarks(0, 6)))
    [table] = status.tables
    assert [(p.partition, p.next_offset, p.lag) for p in table.partitions] == [(0, 1, 5), (1, 5, 1)]
    assert stale_problems(status, 3600) == []
    ingest_file(settings, write_dump(lakehouse / "only.jsonl", [("o.s.t", 0, {"id": 1}, "{not json")]))
    status = collect_status(settings, watermarks=lambda asked: dict.fromkeys(asked, Watermarks(0, 1)))
    assert status.dead_letters_without_table == {"o.s.t": 1}
    assert stale_problems(status, 3600) == ["topic o.s.t: 1 record(s), every one a dead letter: no bronze table"]
    # Each line says why the latest dead letter is one.
    [error] = status.dead_letters_without_table_latest_error.values()
    assert status.tables[0].dead_letters_latest_error == {"i.s.t": error}  # the same reason: not JSON
    assert error.startswith("DecodeError: "), error
    assert "JSON" in error, error
    shown = " ".join(invoke(["--config", str(Path(settings.base_dir) / "cdclake.yml"), "status"]).stdout.split())
    assert f"dead letters: 2 from i.s.t -> bronze.i_s_t; the latest: {error}" in shown, shown
    assert f"dead letters: 1 from o.s.t (no bronze table); the latest: {error}" in shown, shown
    assert "after a fix, `cdclake replay-dead-letters` lands those that decode then" in shown, shown
    # Only while they keep coming: those of a table since dropped or mapped elsewhere made every status stale.
    later = status.generated_at + dt.timedelta(hours=2)
    assert [problem for problem in stale_problems(status, 3600, now=later) if "o.s.t" in problem] == []


def test_lag_is_na_when_the_broker_cannot_say() -> None:
    parts = [
        PartitionStatus("t", 0, 10),
        PartitionStatus("t", 1, 10),
        PartitionStatus("t", 2, 10),
        PartitionStatus("t", 3, 10),
    ]
    marks: dict[tuple[str, int], Watermarks | Exception] = {
        ("t", 0): Watermarks(0, 15),
        ("t", 1): Watermarks(0, 4),
        ("t", 2): RuntimeError("unreachable"),
    }
    apply_watermarks(parts, marks)
    assert (parts[0].lag, parts[0].lag_error) == (5, None)
    assert parts[1].lag is None
    assert "the log ends at offset 4, below bronze's next offset 10: the topic was recreated" in (
        parts[1].lag_error or ""
    )
    assert parts[2].lag is None
    assert parts[2].lag_error == "unreachable"
    assert parts[3].lag is None
    assert parts[3].lag_error == "not asked"


def test_records_deleted_before_they_were_landed_are_a_problem(lakehouse: Path) -> None:
    """A log that starts after bronze's next offset (retention ran while ingest was down): the records in between
    are gone, and ingest stops on that partition (test_kafka_ingest.py). Status says so and exits 3, not lag 0."""
    settings = make_settings(lakehouse)
    source = {"connector": "informix", "commit_lsn": "5", "change_lsn": "5"}
    good = [("i.s.t", n, {"id": n}, {"op": "c", "after": {"id": n}, "source": source}) for n in range(3)]
    ingest_file(settings, write_dump(lakehouse / "good.jsonl", good))
    status = collect_status(settings, watermarks=lambda asked: dict.fromkeys(asked, Watermarks(3, 9)))
    [part] = status.tables[0].partitions
    assert (part.next_offset, part.lag, part.log_start) == (3, 6, None)
    assert stale_problems(status, 3600) == []
    status = collect_status(settings, watermarks=lambda asked: dict.fromkeys(asked, Watermarks(7, 9)))
    [part] = status.tables[0].partitions
    assert (part.next_offset, part.lag, part.log_start) == (3, 6, 7)
    assert stale_problems(status, 3600) == [
        "i.s.t[0]: the log starts at offset 7, after bronze's next offset 3: 4 offset(s) were deleted before they "
        "were landed (records, or a transactional producer's commit marker; ingest stops there until "
        "source.consumer.auto.offset.reset: earliest accepts the gap)"
    ]
    assert status_document(status, 3600, stale_problems(status, 3600))["tables"][0]["offsets"][0]["log_start"] == 7


def test_status_with_an_unreachable_broker_shows_na_and_no_secrets(
    lakehouse: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    secret = "pw-Do-Not-Print-42"
    source = {
        "type": "kafka",
        "bootstrap_servers": "127.0.0.1:9",  # discard port: nothing listens
        "topics": [CUSTOMERS_TOPIC],
        "consumer": {
            "security.protocol": "SASL_PLAINTEXT",
            "sasl.mechanism": "PLAIN",
            "sasl.username": "me",
            "sasl.password": secret,
        },
    }
    settings = make_settings(lakehouse, source=source)
    ingest_file(settings, PG_DUMP)
    config = str(lakehouse / "cdclake.yml")

    result = invoke(["--config", config, "status", "--json", "--lag-timeout", "1"])
    assert result.exit_code == 0, result.output
    document = orjson.loads(result.stdout)
    assert document["lag_checked"] is True
    offsets = next(t for t in document["tables"] if t["name"] == CUSTOMERS)["offsets"]
    assert offsets[0]["lag"] is None
    assert offsets[0]["lag_error"]
    assert secret not in result.output

    # Whatever the client reports, a configured secret never reaches the output.
    def leaky(_source: Any, _timeout: float) -> Any:
        return lambda partitions: dict.fromkeys(partitions, RuntimeError(f"SASL auth failed with password {secret}"))

    monkeypatch.setattr("ingest.status.kafka_watermarks", leaky)
    monkeypatch.setattr("ingest.status.kafka_partitions", lambda _source, _timeout: lambda topics: {})
    for args in (["status"], ["status", "--json"]):
        shown = invoke(["--config", config, *args])
        assert shown.exit_code == 0
        assert "SASL auth failed with password ***" in shown.stdout
        assert secret not in shown.output
    # One line for the reason, not one per partition (an unreachable broker is every partition's reason).
    notes = [line for line in invoke(["--config", config, "status"]).stdout.splitlines() if "lag n/a" in line]
    assert len(notes) == 1, notes
    partitions = [f"{o['topic']}[{o['partition']}]" for table in document["tables"] for o in table["offsets"]]
    assert len(partitions) > 1
    assert notes[0].startswith(f"lag n/a: {', '.join(partitions)}: SASL auth failed"), notes


@pytest.mark.kafka
def test_status_of_a_catalog_that_does_not_exist_is_an_error(tmp_path: Path) -> None:
    """A mistyped SQLite catalog path: status created an empty catalog there and reported "fresh" (exit 0)."""
    from ingest.errors import ConfigError

    config = tmp_path / "cdclake.yml"
    config.write_text(f"lakehouse:\n  warehouse: {tmp_path}/wh\n  catalog_uri: sqlite:///{tmp_path}/typo.db\n")
    with pytest.raises(ConfigError, match=rf"^lakehouse\.catalog_uri: no catalog database at {tmp_path}/typo\.db: "):
        invoke(["--config", str(config), "status", "--no-lag"])
    assert not (tmp_path / "typo.db").exists()
    assert not (tmp_path / "wh").exists()


def test_status_lag_against_a_real_broker(broker: TansuBroker, lakehouse: Path) -> None:  # noqa: F811
    prefix = unique("lag") + "."
    topic = prefix + CUSTOMERS_TOPIC
    lines = [orjson.loads(line) for line in PG_DUMP.read_bytes().splitlines()]
    records = [
        Record(
            topic,
            None if r["key"] is None else r["key"].encode(),
            None if r["payload"] is None else r["payload"].encode(),
            partition=0,
        )
        for r in lines
        if r["topic"] == CUSTOMERS_TOPIC
    ]
    publish(broker, records, partitions=1)
    settings = make_settings(
        lakehouse,
        source={
            "type": "kafka",
            "bootstrap_servers": broker.bootstrap_servers,
            "topics": [topic],
            "group_id": unique("lag-"),
            "consumer": {"session.timeout.ms": "2000", "heartbeat.interval.ms": "500"},
        },
    )
    from ingest.cli.ingest_cmd import build_pipeline

    build_pipeline(settings).run(once=True)
    name = topic.replace(".", "_")
    # Three more changes, one batch each (Tansu's "latest" is exact only at batch boundaries).
    for record in records[-3:]:
        broker.produce([record])
    status = collect_status(settings, lag_timeout_s=5)
    table = next(t for t in status.tables if t.name == name)
    assert [(p.next_offset, p.lag) for p in table.partitions] == [(len(records), 3)]


# -- maintenance: planning (no Spark) --------------------------------------------------------------------------------
def test_maintenance_plan_keeps_silver_position_and_validates_settings(landed: Settings) -> None:
    from pydantic import ValidationError

    settings = landed
    catalog = load_catalog(settings)
    snapshots = sorted(catalog.load_table(f"bronze.{CUSTOMERS}").snapshots(), key=lambda s: s.timestamp_ms)
    make_silver(settings, CUSTOMERS, snapshots[1].snapshot_id, dt.datetime.now(dt.UTC))
    now = dt.datetime.now(dt.UTC)
    config = MaintenanceSettings(bronze=LayerMaintenance(expire_older_than_hours=0, retain_last=1))
    plans = {p.table: p for p in plan_maintenance(catalog, settings, config, ["bronze", "silver"], now=now)}
    assert set(plans) == {
        f"bronze.{name}"
        for name in (CUSTOMERS, "dbserver1_inventory_typed_values", "dbserver1_transaction", DEAD_LETTER_TABLE)
    } | {f"silver.{CUSTOMERS}"}
    customers = plans[f"bronze.{CUSTOMERS}"]
    assert [s.procedure for s in customers.steps] == [
        "rewrite_data_files",
        "rewrite_manifests",
        "expire_snapshots",
        "remove_orphan_files",
    ]
    expire = customers.steps[2]
    applied_at = dt.datetime.fromtimestamp(snapshots[1].timestamp_ms / 1000, tz=dt.UTC)
    assert f"older_than => {timestamp_literal(applied_at)}" in expire.sql
    assert expire.note
    assert f"silver.{CUSTOMERS}" in expire.note
    assert customers.expirable_snapshots == 1  # only the first; the applied one and newer stay
    transactions = plans["bronze.dbserver1_transaction"]
    assert transactions.expirable_snapshots == transactions.snapshots - 1
    assert f"older_than => {timestamp_literal(now)}, retain_last => 1" in transactions.steps[2].sql
    silver = plans[f"silver.{CUSTOMERS}"]
    assert [s.procedure for s in silver.steps] == [
        "rewrite_data_files",
        "rewrite_position_delete_files",
        "rewrite_manifests",
        "expire_snapshots",
        "remove_orphan_files",
    ]
    assert "'delete-file-threshold', '1'" in silver.steps[0].sql
    assert "'min-input-files', '2'" in silver.steps[0].sql
    assert timestamp_literal(dt.datetime(2024, 1, 2, 3, 4, 5, 678901, tzinfo=dt.UTC)) == (
        "TIMESTAMP '2024-01-02 03:04:05.678+00:00'"
    )
    with pytest.raises(ValidationError, match="greater than or equal to 24"):
        LayerMaintenance(orphan_older_than_hours=1)

    dry = invoke(["--config", str(Path(settings.base_dir) / "cdclake.yml"), "maintain", "--dry-run"])
    assert dry.exit_code == 0, dry.output
    assert "CALL lake.system.expire_snapshots(table => 'bronze._cdc_dead_letters'" in dry.stdout
    assert "rewrite_position_delete_files(table => 'silver." in dry.stdout


def test_an_unreadable_table_is_named_and_the_others_still_planned(landed: Settings) -> None:
    """A table whose metadata file is gone: its load raised out of the planning, so no table was maintained and the
    error named none. Now the others are planned (and maintained), and the command exits 1 naming it."""
    settings = landed
    catalog = load_catalog(settings)
    broken = catalog.load_table(f"bronze.{CUSTOMERS}")
    Path(broken.metadata_location.removeprefix("file://")).unlink()
    plans = {plan.table: plan for plan in plan_maintenance(catalog, settings, MaintenanceSettings(), ["bronze"])}
    assert plans[f"bronze.{CUSTOMERS}"].steps == []
    assert (plans[f"bronze.{CUSTOMERS}"].error or "").startswith("cannot be read: ")
    assert plans["bronze.dbserver1_transaction"].steps  # the others as before
    dry = invoke(["--config", str(Path(settings.base_dir) / "cdclake.yml"), "maintain", "--dry-run"])
    assert dry.exit_code == 1, dry.output
    assert "CALL lake.system.expire_snapshots(table => 'bronze.dbserver1_transaction'" in dry.stdout
    assert f"bronze.{CUSTOMERS}: cannot be read: " in dry.stderr
    assert "not maintained (repair or drop it)" in dry.stderr


# -- Spark: sql ------------------------------------------------------------------------------------------------------
TYPES_QUERY = (
    "SELECT 1 AS n, 'a,b' AS s, CAST(NULL AS INT) AS z, array(1, 2) AS arr, named_struct('x', 1, 'y', 'q') AS st, "
    "CAST(1.50 AS DECIMAL(10,2)) AS d, TIMESTAMP '2024-01-02 03:04:05' AS ts"
)


@pytest.fixture(scope="module")
def sql_lake(spark_lakehouse: SparkLakehouse, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Settings]:
    path, settings = spark_lakehouse.config(
        tmp_path_factory.mktemp("sql"), lakehouse={"bronze_namespace": "sqlcli_bronze"}
    )
    ingest_file(settings, PG_DUMP)
    return path, settings


@pytest.mark.spark
def test_sql_formats(sql_lake: tuple[Path, Settings]) -> None:
    config, _settings = sql_lake
    base = ["--config", str(config), "sql"]

    as_csv = invoke([*base, "--format", "csv", TYPES_QUERY])
    assert as_csv.exit_code == 0, as_csv.output
    assert list(csv.reader(io.StringIO(as_csv.stdout))) == [
        ["n", "s", "z", "arr", "st", "d", "ts"],
        ["1", "a,b", "", "[1,2]", '{"x":1,"y":"q"}', "1.50", "2024-01-02 03:04:05"],
    ]
    as_json = invoke([*base, "--format", "json", TYPES_QUERY + ";"])
    assert as_json.exit_code == 0, as_json.output
    assert orjson.loads(as_json.stdout) == [
        {
            "n": 1,
            "s": "a,b",
            "z": None,
            "arr": [1, 2],
            "st": {"x": 1, "y": "q"},
            "d": "1.50",
            "ts": "2024-01-02T03:04:05",
        }
    ]

    query = f"SELECT _cdc_offset, op FROM sqlcli_bronze.{CUSTOMERS} ORDER BY _cdc_offset"
    total = topic_counts(PG_DUMP)[CUSTOMERS_TOPIC]
    lines = invoke([*base, "--format", "jsonl", query])
    assert [orjson.loads(line)["_cdc_offset"] for line in lines.stdout.splitlines()] == list(range(total))
    table = invoke([*base, query + " LIMIT 3"])
    assert table.exit_code == 0, table.output
    assert "_cdc_offset" in table.stdout
    assert "op" in table.stdout
    assert "3 rows" in table.stdout
    truncated = invoke([*base, "--max-rows", "2", query])
    assert "2 rows" in truncated.stdout
    assert "showing the first 2" in truncated.stdout
    empty = invoke([*base, "--format", "json", query + " LIMIT 0"])
    assert orjson.loads(empty.stdout) == []


@pytest.mark.spark
def test_sql_prints_timestamps_in_utc_whatever_tz_says(
    sql_lake: tuple[Path, Settings], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Spark's session time zone is UTC; pyspark turns timestamps into naive datetimes of the process's zone, so
    a user's TZ (here Tokyo, UTC+9) must not shift what `cdclake sql` prints."""
    config, _settings = sql_lake
    monkeypatch.setenv("TZ", "Asia/Tokyo")
    time.tzset()
    as_csv = invoke(["--config", str(config), "sql", "--format", "csv", TYPES_QUERY])
    assert as_csv.exit_code == 0, as_csv.output
    assert list(csv.reader(io.StringIO(as_csv.stdout)))[1][-1] == "2024-01-02 03:04:05"


@pytest.mark.spark
def test_sql_errors_are_one_line_and_exit_1(sql_lake: tuple[Path, Settings]) -> None:
    config, _settings = sql_lake
    missing = invoke(["--config", str(config), "sql", "SELECT * FROM sqlcli_bronze.nope"])
    assert missing.exit_code == 1
    assert missing.stdout == ""
    assert missing.stderr.count("\n") == 1
    assert missing.stderr.startswith("error: [TABLE_OR_VIEW_NOT_FOUND]")
    assert "(line 1, pos 14)" in missing.stderr
    assert "UnresolvedRelation" not in missing.stderr

    syntax = invoke(["--config", str(config), "sql", "--format", "csv", "SELEC 1"])
    assert syntax.exit_code == 1
    assert syntax.stderr == "error: [PARSE_SYNTAX_ERROR] Syntax error at or near 'SELEC'.(line 1, pos 0)\n"


@pytest.mark.spark
def test_sql_names_a_timestamp_python_cannot_hold_and_the_way_round_it(sql_lake: tuple[Path, Settings]) -> None:
    """0001-01-01T00:00:00Z (PostgreSQL's -infinity as `infinite_timestamps: clamp` lands it in a timestamptz):
    pyspark cannot make it a Python datetime. The error says so, and the text of it prints."""
    config, _settings = sql_lake
    first = "timestamp'0001-01-01 00:00:00'"
    failed = invoke(["--config", str(config), "sql", "--format", "csv", f"SELECT {first} AS t"])
    assert failed.exit_code == 1
    assert failed.stderr == (
        "error: year 0 is out of range: a timestamp of the result is too close to year 1 or 9999 for Python; "
        "select it as text (cast(... as string))\n"
    )
    as_text = invoke(["--config", str(config), "sql", "--format", "csv", f"SELECT cast({first} AS string) AS t"])
    assert as_text.exit_code == 0, as_text.output
    assert as_text.stdout == "t\n0001-01-01 00:00:00\n"


@pytest.mark.spark
def test_sql_reads_a_script_from_stdin(sql_lake: tuple[Path, Settings]) -> None:
    config, _settings = sql_lake
    script = "CREATE OR REPLACE TEMPORARY VIEW v AS SELECT 41 AS a; -- a view\nSELECT a + 1 AS b FROM v"
    result = invoke(["--config", str(config), "sql", "--format", "json"], input=script)
    assert result.exit_code == 0, result.output
    assert orjson.loads(result.stdout) == [{"b": 42}]
    failing = invoke(["--config", str(config), "sql"], input="SELECT 1;\nSELECT * FROM nope;\nSELECT 3;")
    assert failing.exit_code == 1
    assert "TABLE_OR_VIEW_NOT_FOUND" in failing.stderr
    assert failing.stdout.count("1 row") == 1


def test_spark_error_line_of_a_plain_exception() -> None:
    assert spark_error_line(RuntimeError("first\nsecond")) == "first"
    assert spark_error_line(RuntimeError("")) == "RuntimeError"


def test_log_lines_print_above_the_progress_line(monkeypatch: pytest.MonkeyPatch) -> None:
    """On a terminal `cdclake ingest` shows a live progress line; the log handler kept the stderr it was made with,
    so each log line landed in the middle of the progress line's text (`read 1  written 1{"ts": ...`). Log lines
    now go through rich's proxy, which prints them above the progress line."""
    from rich.console import Console

    from ingest.cli.ingest_cmd import _run_with_progress
    from ingest.pipeline import IngestStats

    terminal, configured = io.StringIO(), io.StringIO()  # the screen; the stderr the log handler was made with
    handler = logging.StreamHandler(configured)
    handler.setFormatter(logging.Formatter("%(message)s"))
    monkeypatch.setattr(logging.getLogger(), "handlers", [handler])

    class Running:
        stats = IngestStats()
        on_progress: Any = None

        def run(self, once: bool) -> IngestStats:
            self.stats.records_in = 7
            self.on_progress(self.stats)
            logging.getLogger("cdclake.test").warning("a log line")
            return self.stats

    _run_with_progress(cast(Any, Running()), once=True, console=Console(file=terminal, force_terminal=True, width=100))
    assert configured.getvalue() == ""
    lines = [line for line in terminal.getvalue().splitlines() if "a log line" in line]
    assert len(lines) == 1, terminal.getvalue()
    assert "read" not in lines[0], terminal.getvalue()
    assert "read 7" in terminal.getvalue()
    assert handler.stream is configured  # restored


def test_repeated_warnings_are_logged_once_a_window_with_their_count() -> None:
    """librdkafka logs a failing connection at every reconnect attempt, twice a second per broker for as long as a
    cluster is down. Its logger lets each warning or error through once a window, then says how many it held
    back; other lines (another text, a lower level) pass."""
    from ingest.logs import RepeatFilter

    logger = logging.getLogger("cdclake.test.repeats")
    records: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record)

    logger.addHandler(Keep())
    logger.propagate = False
    logger.setLevel(logging.DEBUG)
    logger.addFilter(RepeatFilter(window_s=0.3))
    for attempt in range(5):
        # librdkafka's repeats of a line differ in the time the attempt took and the count it suppressed itself.
        logger.error(
            "%s [%s] %s",
            "FAIL",
            "rdkafka#consumer-1",
            f"Connect to 127.0.0.1:1 failed: Connection refused (after {attempt}ms in state CONNECT"
            + (f", {attempt} identical error(s) suppressed)" if attempt else ")"),
        )
        logger.error("FAIL: Connect to 127.0.0.1:2 failed")  # another broker's: a line of its own
        logger.info("a line below WARNING")
    time.sleep(0.35)
    logger.error(
        "FAIL [rdkafka#consumer-1] Connect to 127.0.0.1:1 failed: Connection refused (after 7ms in state %s)", "CONNECT"
    )
    lines = [record.getMessage() for record in records]
    assert lines.count("a line below WARNING") == 5
    assert lines.count("FAIL: Connect to 127.0.0.1:2 failed") == 1
    refused = [line for line in lines if "127.0.0.1:1" in line]
    assert refused[0] == (
        "FAIL [rdkafka#consumer-1] Connect to 127.0.0.1:1 failed: Connection refused (after 0ms in state CONNECT)"
    )
    assert len(refused) == 2, refused
    assert refused[1].endswith("(after 7ms in state CONNECT) (repeated 4 more times in the last 0s)")


def test_expiry_keeps_silvers_snapshot_when_a_later_one_is_stamped_earlier() -> None:
    """Iceberg's expiry keeps main's snapshots from the newest back to the first older than its cutoff. Bronze is
    written by hosts whose clocks differ (pyiceberg on the ingester's, Spark on maintenance's): a snapshot after the
    one silver applied can carry an earlier timestamp. The cutoff is then that timestamp, or the walk would stop
    above silver's snapshot and expire it (the next run re-read all of bronze)."""
    from types import SimpleNamespace

    # main: 1 (t=100) <- 2 (t=200, applied) <- 3 (t=150: another clock) <- 4 (t=300)
    snapshots = [
        SimpleNamespace(snapshot_id=i, parent_snapshot_id=parent, timestamp_ms=ts)
        for i, parent, ts in ((1, None, 100), (2, 1, 200), (3, 2, 150), (4, 3, 300))
    ]
    table: Any = SimpleNamespace(snapshots=lambda: snapshots, current_snapshot=lambda: snapshots[-1])
    assert protected_position(table, {2: "silver.t"}) == (150, 2, "silver.t")
    assert protected_position(table, {4: "silver.a", 2: "silver.b"}) == (150, 2, "silver.b")  # the deepest
    assert protected_position(table, {}) is None
    off_main = SimpleNamespace(snapshot_id=9, parent_snapshot_id=1, timestamp_ms=120)  # on a branch
    table = SimpleNamespace(snapshots=lambda: [*snapshots, off_main], current_snapshot=lambda: snapshots[-1])
    assert protected_position(table, {9: "silver.c"}) == (120, 9, "silver.c")


def test_the_expiry_keeps_silvers_snapshot_from_the_history_it_finds_when_it_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The bronze snapshot silver applied is protected by the timestamps of main's history when the expiry runs, not
    when `maintain` planned it: compaction and manifest rewrites run in between, for minutes on a large lakehouse,
    and an ingester whose clock is behind may commit meanwhile. Its snapshot, stamped earlier than the applied one,
    would stop Iceberg's walk above the applied snapshot, which would expire (the model then re-reads all bronze)."""
    from types import SimpleNamespace

    import pyiceberg.table.snapshots

    settings = make_settings(tmp_path)
    assert ingest_file(settings, PG_DUMP, max_records=5).stats.flushes > 2
    identifier = f"bronze.{CUSTOMERS}"
    applied = _snapshot_ids(settings, identifier)[1]
    now = dt.datetime.now(dt.UTC)
    make_silver(settings, CUSTOMERS, applied, now)
    maintenance = MaintenanceSettings(bronze=LayerMaintenance(expire_older_than_hours=0, retain_last=1))
    (plan,) = plan_maintenance(load_catalog(settings), settings, maintenance, ["bronze"], [CUSTOMERS], now)
    (expiry,) = [step for step in plan.steps if step.procedure == "expire_snapshots"]
    table = load_catalog(settings).load_table(identifier)
    snapshot = table.snapshot_by_id(applied)
    assert snapshot is not None
    applied_at = snapshot.timestamp_ms
    planned = f"older_than => {timestamp_literal(dt.datetime.fromtimestamp(applied_at / 1000, tz=dt.UTC))}"
    assert planned in expiry.sql_at(now)

    behind = applied_at / 1000 - 3600  # another host, its clock an hour behind, commits to bronze after the plan
    monkeypatch.setattr(pyiceberg.table.snapshots, "time", SimpleNamespace(time=lambda: behind))
    table.append(table.scan(limit=1).to_arrow())
    monkeypatch.undo()
    assert expiry.sql_at(now) == expiry.sql.replace(
        planned, f"older_than => {timestamp_literal(dt.datetime.fromtimestamp(behind, tz=dt.UTC))}"
    )


# -- Spark: maintain ---------------------------------------------------------------------------------------------------
def _snapshot_ids(settings: Settings, identifier: str) -> list[int]:
    table = load_catalog(settings).load_table(identifier)
    return [s.snapshot_id for s in sorted(table.snapshots(), key=lambda s: s.timestamp_ms)]


def _files(settings: Settings, identifier: str) -> tuple[int, int]:
    table = load_catalog(settings).load_table(identifier)
    snapshot = table.current_snapshot()
    assert snapshot is not None
    assert snapshot.summary is not None
    return int(snapshot.summary["total-data-files"] or 0), int(snapshot.summary["total-delete-files"] or 0)


@pytest.mark.spark
def test_maintain_bronze_keeps_offsets_and_rows(spark_lakehouse: SparkLakehouse, tmp_path: Path) -> None:
    config, settings = spark_lakehouse.config(
        tmp_path / "maintain", lakehouse={"bronze_namespace": "mt_bronze", "silver_namespace": "mt_silver"}
    )
    first = ingest_file(settings, PG_DUMP, max_records=5)  # many small commits, many small files
    assert first.stats.flushes > 3
    catalog = load_catalog(settings)
    names = BronzeTables(catalog, "mt_bronze").list_tables()
    offsets_before = bronze_offsets(settings)
    rows_before = {name: scan_rows(settings, f"mt_bronze.{name}") for name in names}
    files_before = {name: _files(settings, f"mt_bronze.{name}")[0] for name in names}
    assert files_before[CUSTOMERS] > 2
    customers_snapshots = _snapshot_ids(settings, f"mt_bronze.{CUSTOMERS}")
    applied = customers_snapshots[1]
    make_silver(settings, CUSTOMERS, applied, dt.datetime.now(dt.UTC))  # silver read bronze up to its 2nd commit
    # A file no snapshot references, written four days ago (a crashed writer's leftover).
    data_dir = Path(catalog.load_table(f"mt_bronze.{CUSTOMERS}").location().removeprefix("file://")) / "data"
    orphan = data_dir / "leftover-from-a-crash.parquet"
    orphan.write_bytes(b"not referenced")
    four_days_ago = time.time() - 4 * 86400
    os.utime(orphan, (four_days_ago, four_days_ago))

    time.sleep(0.01)
    result = invoke(
        ["--config", str(config), "maintain", "--layer", "bronze", "--retain-last", "1", "--expire-older-than", "0"]
    )
    assert result.exit_code == 0, result.output
    assert "rewrite_data_files" in result.stdout
    assert "expire_snapshots" in result.stdout
    # What holds back the expiry is said in a real run too, not only by --dry-run.
    assert f"keeps snapshot {applied} (applied by mt_silver.{CUSTOMERS}, committed " in " ".join(result.output.split())

    # (a) the offsets are still in the table property, and a restart resumes after them: nothing is re-ingested.
    assert bronze_offsets(settings) == offsets_before
    again = ingest_file(settings, PG_DUMP)
    assert (again.stats.written, again.stats.dead_letters) == (0, 0)
    # (b) every row is still there, once.
    assert {name: scan_rows(settings, f"mt_bronze.{name}") for name in names} == rows_before
    for name in names:
        table = catalog.load_table(f"mt_bronze.{name}")
        assert int(table.current_snapshot().summary["total-records"]) == rows_before[name]
        # Compacted to one file per day partition.
        assert _files(settings, f"mt_bronze.{name}")[0] == 1, name
    # Expired down to one snapshot, except that silver's applied snapshot (and what followed it) is kept.
    assert len(_snapshot_ids(settings, "mt_bronze.dbserver1_transaction")) == 1
    kept = _snapshot_ids(settings, f"mt_bronze.{CUSTOMERS}")
    assert kept[0] == applied
    assert customers_snapshots[0] not in kept
    assert not orphan.exists()

    # Another tool expires bronze down to its last snapshot, silver's applied one too: a rewrite is all that is
    # left. Silver is still behind (it applied only the 2nd of the commits compacted there), though it committed
    # after every ingest; status tells from bronze's row count, which silver recorded at the applied snapshot.
    spark_lakehouse.spark.sql(
        f"call {settings.lakehouse.catalog_name}.system.expire_snapshots(table => 'mt_bronze.{CUSTOMERS}', "
        f"older_than => {timestamp_literal(dt.datetime.now(dt.UTC))}, retain_last => 1)"
    )
    bronze = catalog.load_table(f"mt_bronze.{CUSTOMERS}")
    assert [s.snapshot_id for s in bronze.snapshots()] == [bronze.current_snapshot().snapshot_id]
    assert bronze.current_snapshot().summary.operation == Operation.REPLACE
    silver = {t.name: t.silver for t in collect_status(settings).tables}[CUSTOMERS]
    assert silver is not None
    assert silver.behind is True, silver
    assert silver.applied_snapshot_at is None  # expired
    # Once silver has applied every row bronze holds, it is not behind.
    with catalog.load_table(f"mt_silver.{CUSTOMERS}").transaction() as transaction:
        transaction.set_properties({APPLIED_RECORDS_PROPERTY: str(rows_before[CUSTOMERS])})
    silver = {t.name: t.silver for t in collect_status(settings).tables}[CUSTOMERS]
    assert silver is not None
    assert silver.behind is False, silver

    # The stream moves on: exactly the new records land, after the compacted and expired history.
    moved_on = ingest_file(settings, extended_dump(tmp_path / "more.jsonl", 3))
    assert moved_on.stats.written == 3
    assert scan_rows(settings, f"mt_bronze.{CUSTOMERS}") == rows_before[CUSTOMERS] + 3
    assert bronze_offsets(settings)[CUSTOMERS] == {
        (CUSTOMERS_TOPIC, 0): offsets_before[CUSTOMERS][(CUSTOMERS_TOPIC, 0)] + 3
    }

    # status still knows each table's last ingest, from the data once the ingest snapshots are gone.
    status = {t.name: t for t in collect_status(settings).tables}
    assert status["dbserver1_transaction"].last_commit_from == "data"
    assert status["dbserver1_transaction"].last_commit is not None
    assert status[CUSTOMERS].rows == rows_before[CUSTOMERS] + 3


@pytest.mark.spark
def test_maintain_silver_applies_deletes(spark_lakehouse: SparkLakehouse, tmp_path: Path) -> None:
    config, settings = spark_lakehouse.config(
        tmp_path / "maintain_silver", lakehouse={"bronze_namespace": "ms_bronze", "silver_namespace": "ms_silver"}
    )
    spark = spark_lakehouse.spark
    spark.sql("CREATE NAMESPACE IF NOT EXISTS ms_silver")
    spark.sql(
        "CREATE TABLE ms_silver.accounts (id BIGINT, v STRING, _cdc_applied_at TIMESTAMP) USING iceberg "
        "TBLPROPERTIES ('format-version'='2', 'write.delete.mode'='merge-on-read', "
        "'write.update.mode'='merge-on-read', 'write.merge.mode'='merge-on-read')"
    )
    for start in (0, 10, 20):
        spark.sql(
            f"INSERT INTO ms_silver.accounts SELECT id, 'v', current_timestamp() FROM range({start}, {start + 10})"
        )
    spark.sql("DELETE FROM ms_silver.accounts WHERE id % 3 = 0")
    _data_files, delete_files = _files(settings, "ms_silver.accounts")
    assert delete_files > 0

    result = invoke(["--config", str(config), "maintain", "--layer", "silver"])
    assert result.exit_code == 0, result.output
    assert "rewrite_position_delete_files" in result.stdout
    rows = sorted(r.id for r in spark.sql("SELECT id FROM ms_silver.accounts").collect())
    assert rows == [i for i in range(30) if i % 3]
    assert _files(settings, "ms_silver.accounts") == (1, 0)  # deletes applied, files compacted


# -- status: unknown lag under --max-lag, idle tables ------------------------------------------------------------
def _kafka_lakehouse(lakehouse: Path, records: int, bootstrap: str = "127.0.0.1:1") -> tuple[Settings, str]:
    """A lakehouse of ``records`` records of topic i.s.t (partition 0) landed from a file, configured for Kafka."""
    source = {"type": "kafka", "bootstrap_servers": bootstrap, "topics": ["i.s.t"]}
    settings = make_settings(lakehouse, source=source)
    origin = {"connector": "informix", "commit_lsn": "5", "change_lsn": "5"}
    changes = [("i.s.t", n, {"id": n}, {"op": "c", "after": {"id": n}, "source": origin}) for n in range(records)]
    ingest_file(settings, write_dump(lakehouse / "dump.jsonl", changes))
    return settings, str(lakehouse / "cdclake.yml")


def test_max_lag_with_an_unreachable_broker_is_a_problem(lakehouse: Path) -> None:
    """`status --max-lag N` with the broker down showed lag n/a, `problems: []` and exit 0: a lag that cannot be
    read cannot be within N."""
    settings, config = _kafka_lakehouse(lakehouse, 3)
    result = invoke(["--config", config, "status", "--json", "--max-lag", "10", "--lag-timeout", "2"])
    assert result.exit_code == 3, result.output
    document = orjson.loads(result.stdout)
    [table] = document["tables"]
    assert table["offsets"][0]["lag"] is None
    [problem] = document["problems"]
    assert problem.startswith(f"{table['table']}: lag unknown for i.s.t[0] ("), problem
    assert problem.endswith("cannot check --max-lag 10")
    # Without --max-lag an unknown lag is no problem (as before); not checked at all (--no-lag) it is one.
    assert stale_problems(collect_status(settings, check_lag=False), 3600) == []
    unchecked = stale_problems(collect_status(settings, check_lag=False), 3600, max_lag=10)
    assert unchecked == [
        f"{table['table']}: lag unknown for i.s.t[0] (not checked: --no-lag, or a source without a broker), "
        "cannot check --max-lag 10"
    ]


@pytest.mark.kafka
def test_a_table_with_nothing_waiting_is_idle_not_stale(broker: TansuBroker, lakehouse: Path) -> None:  # noqa: F811
    """`status --stale-after S` counted a table stale when its last commit was older than S although its lag was
    read as 0 everywhere (a quiet source): it is idle. With lag waiting, unknown or not checked it stays stale. The
    lag is read from the embedded broker, which the lakehouse's cdclake.yml names; the clock is moved by `now` (and
    `--stale-after 0` for the CLI, where any commit is older than that)."""
    from ingest.status import idle_tables

    topic = unique("idle") + ".s.t"
    origin = {"connector": "informix", "commit_lsn": "5", "change_lsn": "5"}
    changes = [
        Record(topic, orjson.dumps({"id": n}), orjson.dumps({"op": "c", "after": {"id": n}, "source": origin}), 0)
        for n in range(12)
    ]
    # One record per batch: Tansu's high watermark is the start of a partition's last batch + 1 (the end then).
    publish(broker, changes[:10], partitions=1, producer=ONE_RECORD_BATCHES)
    settings = kafka_settings(lakehouse, broker, topics=[topic])
    assert run_kafka(settings).stats.written == 10
    config = str(lakehouse / "cdclake.yml")

    caught_up = collect_status(settings)
    [table] = caught_up.tables
    later = caught_up.generated_at + dt.timedelta(hours=2)
    assert [(p.next_offset, p.high_watermark, p.lag) for p in table.partitions] == [(10, 10, 0)]
    assert stale_problems(caught_up, 3600, now=later) == []
    assert idle_tables(caught_up, 3600, now=later) == [table.table]
    assert idle_tables(caught_up, 3600) == []  # committed within the hour: neither idle nor stale
    shown = invoke(["--config", config, "status", "--stale-after", "0"])
    assert shown.exit_code == 0, shown.output
    assert f"idle: {table.table}: last commit " in shown.stdout
    assert "nothing waiting (lag 0)" in shown.stdout
    as_json = invoke(["--config", config, "status", "--json", "--stale-after", "0"])
    assert as_json.exit_code == 0, as_json.output
    document = orjson.loads(as_json.stdout)
    assert (document["stale"], document["problems"], document["idle"]) == (False, [], [table.table])
    assert document["tables"][0]["idle"] is True
    assert [(o["high_watermark"], o["lag"]) for o in document["tables"][0]["offsets"]] == [(10, 0)]

    assert settings.source is not None
    nowhere = settings.source.model_copy(update={"bootstrap_servers": "127.0.0.1:1"})  # nothing listens
    unknown = collect_status(settings.model_copy(update={"source": nowhere}), lag_timeout_s=1)
    unchecked = collect_status(settings, check_lag=False)
    publish(broker, changes[10:], partitions=1, producer=ONE_RECORD_BATCHES)  # 2 records wait now
    waiting = collect_status(settings)
    assert [(p.next_offset, p.lag) for p in waiting.tables[0].partitions] == [(10, 2)]
    for status in (waiting, unknown, unchecked):
        [problem] = stale_problems(status, 3600, now=later)
        assert problem.startswith(f"{table.table}: last commit 2h00m ago"), problem
        assert idle_tables(status, 3600, now=later) == []
    stale = invoke(["--config", config, "status", "--json", "--stale-after", "0"])
    assert stale.exit_code == 3, stale.output
    document = orjson.loads(stale.stdout)
    assert (document["stale"], document["idle"]) == (True, [])
    [problem] = document["problems"]
    assert problem.startswith(f"{table.table}: last commit "), problem


# -- sql without Spark: a query that starts with '-', errors of any kind ------------------------------------------
def test_sql_takes_a_query_that_starts_with_a_comment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """`cdclake sql "-- daily counts\\nselect 1"` failed with click's "No such option"."""
    from ingest.cli.sql_cmd import SqlRunner

    ran: list[tuple[str, str]] = []
    monkeypatch.setattr(SqlRunner, "run", lambda self, statement: ran.append((self.fmt, statement)))
    config = str(make_settings(tmp_path).base_dir) + "/cdclake.yml"
    query = "-- daily counts\nselect 1"
    for args, fmt in (
        ([query], "table"),
        ([query, "--format", "csv"], "csv"),
        (["--format", "json", query], "json"),
        (["--format", "csv", "--", query], "csv"),
        (["--", query], "table"),
    ):
        ran.clear()
        result = invoke(["--config", config, "sql", *args])
        assert result.exit_code == 0, (args, result.output)
        assert ran == [(fmt, query)], args
    # Real options still are options, and a misspelt one is still an error.
    assert invoke(["--config", config, "sql", "--help"]).stdout.startswith("Usage: ")
    misspelt = invoke(["--config", config, "sql", "--fromat", "csv", "select 1"])
    assert misspelt.exit_code == 2
    assert "No such option '--fromat'" in misspelt.output


def test_sql_script_errors_of_any_kind_are_one_line_and_exit_1(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A statement argument caught only Spark's and Py4J's errors: any other one (while running or printing) was a
    traceback. As at the prompt: one line, exit 1."""
    import ingest.cli.sql_cmd as sql_cmd

    config = str(make_settings(tmp_path).base_dir) + "/cdclake.yml"
    monkeypatch.setattr(sql_cmd.SqlRunner, "spark", property(lambda self: object()))

    def failing(_spark: Any, _statement: str, _max_rows: int | None) -> Any:
        raise ValueError("cannot convert\nsecond line")

    monkeypatch.setattr(sql_cmd, "execute", failing)
    result = invoke(["--config", config, "sql", "SELECT 1"])
    assert result.exit_code == 1
    assert result.stderr == "error: cannot convert\n"

    def rows() -> Any:
        yield (1,)
        raise OSError("broken pipe")

    monkeypatch.setattr(sql_cmd, "execute", lambda _s, _q, _m: sql_cmd.Result(["a"], [True], rows()))
    printing = invoke(["--config", config, "sql", "--format", "csv", "SELECT 1"])
    assert printing.exit_code == 1
    assert printing.stderr == "error: broken pipe\n"


def test_silver_tables_of_a_models_own_schema_are_maintained(landed: Settings) -> None:
    """A dbt model with a `schema` of its own writes silver (and its tombstones) to `silver_<schema>`: maintain
    planned only the silver namespace, so those merge-on-read tables piled up delete files and snapshots."""
    settings = landed
    catalog = load_catalog(settings)
    bronze = catalog.load_table(f"bronze.{CUSTOMERS}").current_snapshot()
    assert bronze is not None
    catalog.create_namespace_if_not_exists("silver_finance")
    schema = pa.schema([pa.field("id", pa.int64())])
    for name, properties in (
        ("customers_current", {APPLIED_SNAPSHOT_PROPERTY: str(bronze.snapshot_id)}),
        ("customers_current__cdc_tombstones", {}),
    ):
        table = catalog.create_table(f"silver_finance.{name}", schema, properties=properties)
        table.append(pa.table({"id": [1]}, schema=schema))
    catalog.create_namespace_if_not_exists("scratch")  # no table that applies bronze: not silver
    catalog.create_table("scratch.notes", schema).append(pa.table({"id": [1]}, schema=schema))
    plans = {p.table: p for p in plan_maintenance(catalog, settings, MaintenanceSettings(), ["silver"])}
    assert set(plans) == {"silver_finance.customers_current", "silver_finance.customers_current__cdc_tombstones"}
    assert all(plan.layer == "silver" for plan in plans.values())
    expire_all = MaintenanceSettings(bronze=LayerMaintenance(expire_older_than_hours=0, retain_last=1))
    bronze_plans = plan_maintenance(catalog, settings, expire_all, ["bronze"])
    (customers,) = [plan for plan in bronze_plans if plan.table == f"bronze.{CUSTOMERS}"]
    assert any("silver_finance.customers_current" in (step.note or "") for step in customers.steps)


def test_silver_tables_of_any_namespace_keep_their_bronze_snapshot(tmp_path: Path) -> None:
    """A dbt model with a `schema` of its own writes silver to `silver_<schema>`: maintain keeps the bronze snapshot
    it applied too, as it does for the silver namespace's tables (bronze's own tables are no silver)."""
    settings = make_settings(tmp_path)
    catalog = load_catalog(settings)
    schema = pa.schema([pa.field("id", pa.int64())])
    for namespace, name, snapshot in (("silver", "a", 11), ("silver_finance", "b", 22), ("bronze", "c", 33)):
        catalog.create_namespace_if_not_exists(namespace)
        catalog.create_table(f"{namespace}.{name}", schema, properties={APPLIED_SNAPSHOT_PROPERTY: str(snapshot)})
    catalog.create_table("silver_finance.plain", schema)
    catalog.create_table("silver.a_history", schema, properties={APPLIED_SNAPSHOT_PROPERTY: "11"})
    assert silver_positions(catalog, settings.lakehouse.bronze_namespace) == {
        11: ["silver.a", "silver.a_history"],
        22: ["silver_finance.b"],
    }


def test_maintain_keeps_the_snapshot_a_silver_table_holding_transactions_reads_again_from(tmp_path: Path) -> None:
    """A silver model with complete_transactions that holds changes reads bronze again from where the held unit
    began: `cdclake maintain` keeps that snapshot too (expired, the next run would re-read all of bronze)."""
    settings = make_settings(tmp_path)
    catalog = load_catalog(settings)
    schema = pa.schema([pa.field("id", pa.int64())])
    for namespace in ("bronze", "silver"):
        catalog.create_namespace_if_not_exists(namespace)
    bronze = catalog.create_table("bronze.t", schema)
    snapshots = []
    for row in range(3):
        bronze.append(pa.table({"id": [row]}, schema=schema))
        snapshots.append(bronze.refresh().current_snapshot().snapshot_id)
    held = {HELD_TRANSACTIONS_PROPERTY: f'{{"from": "{snapshots[0]}", "ids": ["734"]}}'}
    catalog.create_table("silver.a", schema, properties={APPLIED_SNAPSHOT_PROPERTY: str(snapshots[2]), **held})
    released = {HELD_TRANSACTIONS_PROPERTY: ""}  # what a run that holds nothing any more records
    catalog.create_table("silver.b", schema, properties={APPLIED_SNAPSHOT_PROPERTY: str(snapshots[2]), **released})
    namespace = settings.lakehouse.bronze_namespace
    assert silver_positions(catalog, namespace) == {snapshots[2]: ["silver.a", "silver.b"]}
    assert silver_positions(catalog, namespace, held=True) == {
        snapshots[0]: ["silver.a (its held transactions)"],
        snapshots[2]: ["silver.a", "silver.b"],
    }
    expire_all = MaintenanceSettings(bronze=LayerMaintenance(expire_older_than_hours=0, retain_last=1))
    (plan,) = plan_maintenance(catalog, settings, expire_all, ["bronze"])
    notes = " ".join(step.note or "" for step in plan.steps)
    assert f"keeps snapshot {snapshots[0]} (applied by silver.a (its held transactions)" in notes


def test_status_finds_a_silver_table_named_otherwise(tmp_path: Path) -> None:
    """A silver model with an alias or a schema of its own (`silver_finance.customers_current`) is shown beside its
    bronze table, found by the bronze snapshot it applied (before, only `silver.<bronze name>` was); a bronze table
    no silver table applies has none."""
    settings = make_settings(tmp_path)
    ingest_file(settings, FIXTURES / "debezium" / "postgres" / "dbserver1.jsonl")
    catalog = load_catalog(settings)
    bronze = catalog.load_table(f"bronze.{CUSTOMERS}")
    snapshot = bronze.current_snapshot()
    catalog.create_namespace_if_not_exists("silver_finance")
    catalog.create_table(
        "silver_finance.customers_current",
        pa.schema([pa.field("id", pa.int64())]),
        properties={
            APPLIED_SNAPSHOT_PROPERTY: str(snapshot.snapshot_id),
            APPLIED_RECORDS_PROPERTY: snapshot.summary["total-records"],
        },
    )
    silver = {t.name: t.silver for t in collect_status(settings, check_lag=False).tables}
    found = silver[CUSTOMERS]
    assert found is not None
    assert found.table == "silver_finance.customers_current"
    assert found.behind is False
    assert [name for name, other in silver.items() if other is not None] == [CUSTOMERS]


def test_status_shows_a_silver_table_holding_incomplete_transactions_as_behind(tmp_path: Path) -> None:
    """complete_transactions: a silver table that has read bronze's latest snapshot but holds the changes of an
    incomplete transaction has not applied them. Status showed it up to date; it is behind since the first bronze
    commit after the snapshot it reads again from, and says how many transactions it holds (text, JSON, and the
    stale check)."""
    settings = make_settings(tmp_path)
    ingest_file(settings, PG_DUMP)
    catalog = load_catalog(settings)
    first = catalog.load_table(f"bronze.{CUSTOMERS}").current_snapshot()
    ingest_file(settings, extended_dump(tmp_path / "more.jsonl", extra=3))
    latest = catalog.load_table(f"bronze.{CUSTOMERS}").current_snapshot()
    assert first is not None
    assert latest is not None
    assert latest.snapshot_id != first.snapshot_id
    catalog.create_namespace_if_not_exists("silver")
    held = f'{{"from": "{first.snapshot_id}", "ids": ["734", "735"]}}'
    catalog.create_table(
        f"silver.{CUSTOMERS}",
        pa.schema([pa.field("id", pa.int64())]),
        properties={
            APPLIED_SNAPSHOT_PROPERTY: str(latest.snapshot_id),
            APPLIED_RECORDS_PROPERTY: latest.summary["total-records"],
            HELD_TRANSACTIONS_PROPERTY: held,
        },
    )
    status = collect_status(settings, check_lag=False)
    (silver,) = next(t for t in status.tables if t.name == CUSTOMERS).silvers
    assert (silver.behind, silver.held_transactions) == (True, 2)
    assert silver.behind_since == dt.datetime.fromtimestamp(latest.timestamp_ms / 1000, dt.UTC)
    later = dt.datetime.now(dt.UTC) + dt.timedelta(hours=2)
    (problem,) = [p for p in stale_problems(status, 3600, now=later) if p.startswith("silver")]
    assert problem.startswith(f"silver.{CUSTOMERS}: behind bronze.{CUSTOMERS} for ")
    assert problem.endswith("longer than 3600s, holding the changes of 2 incomplete source transaction(s)")
    document = status_document(status, 3600, [])
    entry = next(t for t in document["tables"] if t["name"] == CUSTOMERS)
    assert entry["silver"]["held_transactions"] == 2
    config = str(Path(settings.base_dir) / "cdclake.yml")
    text = invoke(["--config", config, "status", "--no-lag"]).stdout
    state = " ".join(word for line in text.splitlines() if "│" in line for word in line.split("│")[3].split())
    assert "holding 2 incomplete transaction(s)" in state


def test_status_shows_every_silver_table_of_a_bronze_table(tmp_path: Path) -> None:
    """A current state and a history built from one bronze table are both shown, the silver table of the same name
    first, and each one behind counts as a problem (before, status showed one silver table per bronze table, so a
    history that stopped being built went unnoticed)."""
    settings = make_settings(tmp_path)
    ingest_file(settings, PG_DUMP)
    catalog = load_catalog(settings)
    bronze = catalog.load_table(f"bronze.{CUSTOMERS}")
    first = bronze.current_snapshot()
    assert first is not None
    ingest_file(settings, extended_dump(tmp_path / "more.jsonl", extra=3))
    bronze = catalog.load_table(f"bronze.{CUSTOMERS}")
    latest = bronze.current_snapshot()
    assert latest is not None
    assert latest.snapshot_id != first.snapshot_id
    schema = pa.schema([pa.field("id", pa.int64())])
    catalog.create_namespace_if_not_exists("silver")
    catalog.create_namespace_if_not_exists("silver_audit")
    for identifier, snapshot in (
        (f"silver_audit.{CUSTOMERS}_history", first),  # a history that stopped at the first ingest
        (f"silver.{CUSTOMERS}", latest),
        (f"silver.{CUSTOMERS}_current", latest),
    ):
        catalog.create_table(
            identifier,
            schema,
            properties={
                APPLIED_SNAPSHOT_PROPERTY: str(snapshot.snapshot_id),
                APPLIED_RECORDS_PROPERTY: snapshot.summary["total-records"],
            },
        )
    status = collect_status(settings, check_lag=False)
    table = next(t for t in status.tables if t.name == CUSTOMERS)
    shown = {item.table: item.behind for item in table.silvers}
    assert list(shown) == [f"silver.{CUSTOMERS}", f"silver.{CUSTOMERS}_current", f"silver_audit.{CUSTOMERS}_history"]
    assert shown == {
        f"silver.{CUSTOMERS}": False,
        f"silver.{CUSTOMERS}_current": False,
        f"silver_audit.{CUSTOMERS}_history": True,
    }
    later = dt.datetime.now(dt.UTC) + dt.timedelta(hours=2)
    problems = [p for p in stale_problems(status, 3600, now=later) if p.startswith("silver")]
    assert problems
    assert all(p.startswith(f"silver_audit.{CUSTOMERS}_history: behind bronze.{CUSTOMERS} for ") for p in problems)
    document = status_document(status, 3600, [])
    entry = next(t for t in document["tables"] if t["name"] == CUSTOMERS)
    assert [item["table"] for item in entry["silver_tables"]] == list(shown)
    assert entry["silver"]["table"] == f"silver.{CUSTOMERS}"
    config = str(Path(settings.base_dir) / "cdclake.yml")
    text = invoke(["--config", config, "status", "--no-lag"]).stdout
    assert f"silver_audit.{CUSTOMERS}_history" in text
    assert f"silver.{CUSTOMERS}_current" in text
