"""`cdclake scaffold`: one model per bronze table, never overwriting an edited file, keyless tables reported."""

from __future__ import annotations

from pathlib import Path

import orjson

from ingest.bronze.tables import BronzeTables
from ingest.lakehouse import load_catalog
from ingest.pipeline import Pipeline
from ingest.scaffold import is_unedited, scaffold
from ingest.sources.file import FileSource
from tests.conftest import FIXTURES, make_settings


def land(lakehouse: Path, dump: Path) -> BronzeTables:
    settings = make_settings(lakehouse)
    tables = BronzeTables(load_catalog(settings), "bronze")
    Pipeline(settings.ingest, tables, FileSource(dump)).run(once=True)
    return tables


def test_scaffold_writes_models_and_respects_edits(lakehouse: Path, tmp_path: Path) -> None:
    tables = land(lakehouse, FIXTURES / "debezium" / "postgres" / "dbserver1.jsonl")
    project = tmp_path / "project"
    report = scaffold(tables, project)
    models = project / "models" / "silver"
    names = sorted(p.name for p in report.written)
    assert names == [
        "_bronze_sources.yml",
        "dbserver1_inventory_customers.sql",
        "dbserver1_inventory_customers.yml",
        "dbserver1_inventory_typed_values.sql",
        "dbserver1_inventory_typed_values.yml",
    ]
    sql = (models / "dbserver1_inventory_customers.sql").read_text()
    assert "materialized='cdc_silver', keys=['id']" in sql
    assert "source('bronze', 'dbserver1_inventory_customers')" in sql
    assert "cdclake.cdclake_equals_recompute" in (models / "dbserver1_inventory_customers.yml").read_text()
    # The transaction-metadata table is not a change table: no model, and not reported as a problem.
    assert not (models / "dbserver1_transaction.sql").exists()
    assert report.skipped == {}

    assert scaffold(tables, project).written == []  # idempotent

    edited = models / "dbserver1_inventory_customers.sql"
    edited.write_text(edited.read_text() + "where op is not null\n")
    assert not is_unedited(edited)
    again = scaffold(tables, project)
    assert "dbserver1_inventory_customers" in again.existing
    assert again.written == []
    assert "where op is not null" in edited.read_text()


def test_a_table_of_logical_decoding_messages_gets_no_model(lakehouse: Path, tmp_path: Path) -> None:
    """`<topic.prefix>.message` (op m, keyed by the message's prefix) is no table's changes: no silver model."""
    tables = land(lakehouse, FIXTURES / "debezium" / "postgres" / "messages.jsonl")
    report = scaffold(tables, tmp_path / "project")
    assert sorted(p.name for p in report.written) == [
        "_bronze_sources.yml",
        "dbserver1_inventory_orders.sql",
        "dbserver1_inventory_orders.yml",
    ]
    assert report.skipped == {}


def test_scaffold_writes_into_the_projects_model_paths(lakehouse: Path, tmp_path: Path) -> None:
    """A project whose dbt_project.yml says `model-paths: [src, more]`: models went to models/silver, which dbt
    never reads, and a model under `more/` was written again. The first path takes them; all count as modelled."""
    tables = land(lakehouse, FIXTURES / "debezium" / "postgres" / "dbserver1.jsonl")
    project = tmp_path / "project"
    (project / "more").mkdir(parents=True)
    (project / "dbt_project.yml").write_text("name: mine\nconfig-version: 2\nmodel-paths: [src, more]\n")
    (project / "more" / "dbserver1_inventory_typed_values.sql").write_text("select 1\n")
    report = scaffold(tables, project)
    assert sorted(str(p.relative_to(project)) for p in report.written) == [
        "src/silver/_bronze_sources.yml",
        "src/silver/dbserver1_inventory_customers.sql",
        "src/silver/dbserver1_inventory_customers.yml",
    ]
    assert report.existing == ["dbserver1_inventory_typed_values"]
    assert not (project / "models").exists()


def test_a_table_with_a_model_is_never_scaffolded_again(lakehouse: Path, tmp_path: Path) -> None:
    """Unedited, moved to another folder, or of another history: a model that exists is the user's. (Before,
    an unedited model was rewritten with the run's --history, and the next dbt build asked for --full-refresh;
    a moved one was written again, and dbt found two models of one name.)"""
    tables = land(lakehouse, FIXTURES / "debezium" / "postgres" / "dbserver1.jsonl")
    project = tmp_path / "project"
    models = project / "models" / "silver"
    scaffold(tables, project, select="*customers", history="scd2")
    history = models / "dbserver1_inventory_customers.sql"
    before = history.read_text()
    report = scaffold(tables, project)  # history 'current', every table
    assert history.read_text() == before
    assert "history='scd2'" in before
    assert report.existing == ["dbserver1_inventory_customers"]
    moved = models / "sales" / "dbserver1_inventory_typed_values.sql"
    moved.parent.mkdir()
    (models / "dbserver1_inventory_typed_values.sql").rename(moved)
    assert scaffold(tables, project).written == []
    assert not (models / "dbserver1_inventory_typed_values.sql").exists()


def test_a_new_table_missing_from_an_edited_sources_file_is_reported(lakehouse: Path, tmp_path: Path) -> None:
    """The user edited the generated sources file (freshness, descriptions): scaffold keeps it, and a new bronze
    table it does not declare gets no model (source() would not compile) but a message saying what to do."""
    tables = land(lakehouse, FIXTURES / "debezium" / "postgres" / "dbserver1.jsonl")
    project = tmp_path / "project"
    scaffold(tables, project)
    sources = project / "models" / "silver" / "_bronze_sources.yml"
    sources.write_text(sources.read_text() + "# freshness: checked hourly\n")
    tables = land(lakehouse, FIXTURES / "debezium" / "seeds" / "informix.jsonl")
    report = scaffold(tables, project)
    assert sources in report.kept
    new = sorted(set(tables.list_tables()) - declared(sources))
    assert new
    for name in new:
        if name in report.skipped:
            assert "not a source in" in report.skipped[name]
        assert not (project / "models" / "silver" / f"{name}.sql").exists()
    assert any("not a source in" in reason for reason in report.skipped.values())


def declared(sources: Path) -> set[str]:
    from ingest.scaffold import declared_sources

    return declared_sources([sources.parent], "bronze").get(sources, set())


def test_a_source_declared_in_a_file_of_the_users_own_is_not_declared_again(lakehouse: Path, tmp_path: Path) -> None:
    """The user moved scaffold's sources file (or declares source `bronze` in a file of their own): scaffold used
    to write its file again beside it, and two declarations of one source make dbt refuse the whole project."""
    import yaml

    tables = land(lakehouse, FIXTURES / "debezium" / "postgres" / "dbserver1.jsonl")
    project = tmp_path / "project"
    scaffold(tables, project)
    generated = project / "models" / "silver" / "_bronze_sources.yml"
    moved = project / "models" / "sources" / "bronze.yml"
    moved.parent.mkdir()
    generated.rename(moved)
    report = scaffold(tables, project)
    assert not generated.exists()
    assert moved in report.kept
    assert report.skipped == {}
    files = [path for path in (project / "models").rglob("*.yml") if "sources" in yaml.safe_load(path.read_text())]
    assert files == [moved]


def test_a_table_gone_from_bronze_stays_declared_while_a_model_reads_it(lakehouse: Path, tmp_path: Path) -> None:
    """A bronze table dropped (its topic recreated, a table_mapping changed) while its model stays: scaffold's
    regenerated sources file used to leave it out, and dbt then refuses every model, not just that one's."""
    tables = land(lakehouse, FIXTURES / "debezium" / "postgres" / "dbserver1.jsonl")
    project = tmp_path / "project"
    scaffold(tables, project)
    sources = project / "models" / "silver" / "_bronze_sources.yml"
    gone = "dbserver1_inventory_typed_values"
    assert gone in declared(sources)
    tables.catalog.drop_table(f"bronze.{gone}")
    assert gone not in tables.list_tables()
    scaffold(tables, project)
    assert gone in declared(sources)  # its model still reads it
    (project / "models" / "silver" / f"{gone}.sql").unlink()
    scaffold(tables, project)
    assert gone not in declared(sources)
    assert "dbserver1_inventory_customers" in declared(sources)


def test_a_table_of_unknown_kind_is_reported(lakehouse: Path, tmp_path: Path) -> None:
    """A bronze table without `cdclake.kind` (another writer's) got no model without a word; the known kinds that
    have no silver (transactions) stay quiet."""
    tables = land(lakehouse, FIXTURES / "debezium" / "postgres" / "dbserver1.jsonl")
    name = "dbserver1_inventory_customers"
    with tables.catalog.load_table(f"bronze.{name}").transaction() as transaction:
        transaction.remove_properties("cdclake.kind")
    report = scaffold(tables, tmp_path / "project")
    assert list(report.skipped) == [name]
    assert "no cdclake.kind property" in report.skipped[name]


def test_scaffold_select_pattern(lakehouse: Path, tmp_path: Path) -> None:
    tables = land(lakehouse, FIXTURES / "debezium" / "postgres" / "dbserver1.jsonl")
    report = scaffold(tables, tmp_path / "p", select="*typed*")
    assert [p.name for p in report.written if p.suffix == ".sql"] == ["dbserver1_inventory_typed_values.sql"]


def test_table_without_key_is_reported_and_skipped(lakehouse: Path, tmp_path: Path) -> None:
    source = {"connector": "informix", "commit_lsn": "1", "change_lsn": "1"}
    line = {
        "topic": "ifx.s.nokey",
        "partition": 0,
        "offset": 0,
        "key": None,  # a table without a primary key: Debezium sends no key
        "payload": orjson.dumps({"op": "c", "after": {"a": 1}, "source": source}).decode(),
    }
    dump = tmp_path / "nokey.jsonl"
    dump.write_bytes(orjson.dumps(line) + b"\n")
    tables = land(lakehouse, dump)
    report = scaffold(tables, tmp_path / "project")
    assert "ifx_s_nokey" in report.skipped
    assert "no key" in report.skipped["ifx_s_nokey"]
    assert not (tmp_path / "project" / "models" / "silver" / "ifx_s_nokey.sql").exists()


def test_scaffold_history_models(lakehouse: Path, tmp_path: Path) -> None:
    tables = land(lakehouse, FIXTURES / "debezium" / "postgres" / "dbserver1.jsonl")
    project = tmp_path / "project"
    scaffold(tables, project, select="*customers", history="scd2")
    models = project / "models" / "silver"
    sql = (models / "dbserver1_inventory_customers.sql").read_text()
    assert "materialized='cdc_silver', keys=['id'], history='scd2'" in sql
    described = (models / "dbserver1_inventory_customers.yml").read_text()
    assert "_cdc_valid_from" in described
    assert "_cdc_is_current" in described
    assert "_cdc_order" not in described
    assert "cdclake.cdclake_keys_unique" in described  # the generic tests read history tables too


def test_a_table_that_cannot_be_read_is_reported_and_the_rest_scaffolded(lakehouse: Path, tmp_path: Path) -> None:
    """One bronze table whose metadata file is gone (a botched copy, a storage mistake): scaffold reports it and
    writes the models of the others (it stopped with a traceback, leaving the tables after it without one)."""
    tables = land(lakehouse, FIXTURES / "debezium" / "postgres" / "dbserver1.jsonl")
    names = sorted(path.stem for path in scaffold(tables, tmp_path / "intact").written if path.suffix == ".sql")
    assert len(names) >= 2, names
    broken = names[0]
    table = tables.load(broken)
    assert table is not None
    Path(table.metadata_location.removeprefix("file://")).unlink()
    report = scaffold(tables, tmp_path / "project")
    assert report.skipped[broken].startswith("could not be read: "), report.skipped
    assert sorted(path.stem for path in report.written if path.suffix == ".sql") == names[1:]


def test_the_command_writes_only_into_a_dbt_project(lakehouse: Path, tmp_path: Path) -> None:
    """`cdclake scaffold` with `dbt.project_dir` naming a folder without dbt_project.yml (a new or mistyped path)
    wrote models there that no `dbt build` would ever run, and said nothing. It now refuses, naming the setting; in
    a dbt project it writes the models as before."""
    from click.testing import CliRunner

    from ingest.cli import cli
    from ingest.errors import ConfigError

    land(lakehouse, FIXTURES / "debezium" / "postgres" / "dbserver1.jsonl")
    project = tmp_path / "project"
    make_settings(lakehouse, dbt={"project_dir": str(project)})  # rewrites cdclake.yml, same lakehouse
    config = str(lakehouse / "cdclake.yml")
    refused = CliRunner().invoke(cli, ["--config", config, "scaffold"])
    assert isinstance(refused.exception, ConfigError), refused.output
    assert str(refused.exception).startswith(f"dbt.project_dir: {project} is not a dbt project (no dbt_project.yml)")
    assert not project.exists()

    project.mkdir()
    (project / "dbt_project.yml").write_text("name: mine\nprofile: cdclake\nconfig-version: 2\n")
    written = CliRunner().invoke(cli, ["--config", config, "scaffold"])
    assert written.exit_code == 0, written.output
    assert (project / "models" / "silver" / "dbserver1_inventory_customers.sql").is_file()


def test_the_command_says_why_there_is_nothing_to_scaffold(lakehouse: Path, tmp_path: Path) -> None:
    """A `--select` pattern no table matches (a typo), or a lakehouse with no bronze table yet: said so, with the
    tables there are, where it said "every bronze table has its silver model"."""
    from click.testing import CliRunner

    from ingest.cli import cli

    land(lakehouse, FIXTURES / "debezium" / "postgres" / "dbserver1.jsonl")
    project = tmp_path / "project"
    project.mkdir()
    (project / "dbt_project.yml").write_text("name: mine\nprofile: cdclake\nconfig-version: 2\n")
    make_settings(lakehouse, dbt={"project_dir": str(project)})
    config = str(lakehouse / "cdclake.yml")
    unmatched = CliRunner().invoke(cli, ["--config", config, "scaffold", "--select", "dbserver2_*"])
    assert unmatched.exit_code == 0, unmatched.output
    assert "nothing to scaffold: no table of bronze matches --select 'dbserver2_*' (dbserver1_" in unmatched.output
    load_catalog(make_settings(tmp_path / "empty", dbt={"project_dir": str(project)}))  # created, no table yet
    empty = CliRunner().invoke(cli, ["--config", str(tmp_path / "empty" / "cdclake.yml"), "scaffold"])
    assert empty.exit_code == 0, empty.output
    assert "nothing to scaffold: bronze has no tables yet (`cdclake ingest` creates them)" in empty.output


def test_a_table_named_like_a_models_own_tables_gets_no_model(lakehouse: Path, tmp_path: Path) -> None:
    """`<model>__cdc_batch` and `<model>__cdc_tombstones` are a model's own tables, which its runs drop: a topic
    mapped to such a name would have had a model written whose silver table another model's run drops."""
    tables = land(lakehouse, FIXTURES / "debezium" / "postgres" / "dbserver1.jsonl")
    tables.catalog.rename_table(
        "bronze.dbserver1_inventory_typed_values", "bronze.dbserver1_inventory_customers__cdc_batch"
    )
    report = scaffold(tables, tmp_path / "project")
    assert "holds '__cdc_'" in report.skipped["dbserver1_inventory_customers__cdc_batch"]
    assert not (tmp_path / "project" / "models" / "silver" / "dbserver1_inventory_customers__cdc_batch.sql").exists()
    assert (tmp_path / "project" / "models" / "silver" / "dbserver1_inventory_customers.sql").exists()
