"""The `cdclake` command. One module per subcommand; this module only wires them together."""

from __future__ import annotations

import logging
import sys

import click

from ingest import __version__
from ingest.cli.common import CONFIG_HELP
from ingest.errors import CdclakeError
from ingest.logs import json_logging


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="cdclake")
@click.option(
    "--config",
    "config_path",
    type=click.Path(dir_okay=False),
    help=CONFIG_HELP,  # CDCLAKE_CONFIG is read by ingest.config, so that its errors name the variable
)
@click.option(
    "--log-level",
    type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"], case_sensitive=False),
    default="INFO",
    show_default=True,
)
@click.option("--log-format", type=click.Choice(["auto", "json", "text"]), default="auto", show_default=True)
@click.pass_context
def cli(ctx: click.Context, config_path: str | None, log_level: str, log_format: str) -> None:
    """cdclake: Debezium change events -> Iceberg bronze -> net-effect silver with dbt on Spark."""
    from ingest.logs import configure

    configure(log_level, log_format)
    ctx.obj = {"config_path": config_path}


def _register() -> None:
    from ingest.cli import dbt_cmd, demo_cmd, ingest_cmd, maintain_cmd, scaffold_cmd, sql_cmd, status_cmd

    cli.add_command(ingest_cmd.ingest)
    cli.add_command(scaffold_cmd.scaffold)
    cli.add_command(dbt_cmd.dbt)
    cli.add_command(dbt_cmd.dbt_profile)
    cli.add_command(demo_cmd.demo)
    cli.add_command(sql_cmd.sql)
    cli.add_command(status_cmd.status)
    cli.add_command(maintain_cmd.maintain)


_register()


def main() -> None:
    try:
        result = cli.main(standalone_mode=False)
        if isinstance(result, int):
            sys.exit(result)
    except click.exceptions.Abort:
        sys.exit(130)
    except click.ClickException as exc:
        exc.show()
        sys.exit(exc.exit_code)
    except CdclakeError as exc:
        _report_error(f"error: {exc}")
        sys.exit(2)
    except Exception as exc:
        if not json_logging():
            raise
        logging.getLogger("cdclake").exception("failed: %s", exc)
        sys.exit(1)


def _report_error(message: str) -> None:
    """In JSON-log mode (containers) the error is one more JSON line; on a terminal it is red text."""
    if json_logging():
        logging.getLogger("cdclake").error(message)
    else:
        click.secho(message, fg="red", err=True)
