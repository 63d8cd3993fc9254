"""`cdclake scaffold`: write silver models for bronze tables that have none."""

from __future__ import annotations

import click

from ingest.cli.common import config_option, settings_from
from ingest.errors import ConfigError
from ingest.text import first_few


@click.command()
@config_option
@click.option("--select", "select", default=None, help="Only bronze tables matching this glob pattern.")
@click.option(
    "--history",
    type=click.Choice(["current", "scd2"]),
    default="current",
    show_default=True,
    help="What new models keep: each key's current state, or every version (SCD type 2).",
)
@click.pass_context
def scaffold(ctx: click.Context, select: str | None, history: str) -> int:
    """Write models/silver/<table>.sql and .yml for each bronze table that has no model (never overwriting a file)."""
    from ingest.bronze.tables import BronzeTables
    from ingest.dbt_runner import project_dir
    from ingest.lakehouse import load_catalog
    from ingest.scaffold import scaffold as run_scaffold

    settings = settings_from(ctx)
    project = project_dir(settings)
    if not (project / "dbt_project.yml").is_file():  # models written there would never run
        raise ConfigError(
            f"dbt.project_dir: {project} is not a dbt project (no dbt_project.yml): point it at yours, or copy "
            "cdclake's dbt_project/ there (docs/silver.md)"
        )
    tables = BronzeTables(load_catalog(settings, create=False), settings.lakehouse.bronze_namespace)
    report = run_scaffold(tables, project, select, "scd2" if history == "scd2" else "current")
    for path in report.written:
        click.echo(f"wrote {path}")
    for path in report.kept:
        click.echo(f"kept  {path} (edited by you)")
    for table, reason in sorted(report.skipped.items()):
        click.secho(f"skipped {table}: {reason}", fg="yellow", err=True)
    if report.existing and (report.written or report.skipped):
        click.echo(f"{len(report.existing)} table(s) have a model already (delete one to have it written again)")
    namespace = settings.lakehouse.bronze_namespace
    if not report.tables:
        click.secho(f"nothing to scaffold: {namespace} has no tables yet (`cdclake ingest` creates them)", err=True)
    elif not report.selected:
        shown = first_few(report.tables, 10)
        click.secho(f"nothing to scaffold: no table of {namespace} matches --select {select!r} ({shown})", err=True)
    elif not report.written and not report.kept and not report.skipped:
        click.echo("nothing to scaffold: every bronze table has its silver model")
    return 0
