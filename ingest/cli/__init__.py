"""The `cdclake` command. One module per subcommand; this module only wires them together."""

from __future__ import annotations

import importlib
import logging
import sys
from typing import Any

import click

from ingest import __version__
from ingest.cli.common import CONFIG_HELP
from ingest.errors import CdclakeError
from ingest.logs import json_logging

# Subcommand -> "module:attribute" of its click command, imported when it is run: a command imports only what it
# uses (`cdclake dbt` started in 0.24 s of imports instead of 1.2: not the ingest pipeline's pyiceberg and pyarrow).
SUBCOMMANDS = {
    "ingest": "ingest.cli.ingest_cmd:ingest",
    "scaffold": "ingest.cli.scaffold_cmd:scaffold",
    "dbt": "ingest.cli.dbt_cmd:dbt",
    "dbt-profile": "ingest.cli.dbt_cmd:dbt_profile",
    "demo": "ingest.cli.demo_cmd:demo",
    "sql": "ingest.cli.sql_cmd:sql",
    "status": "ingest.cli.status_cmd:status",
    "maintain": "ingest.cli.maintain_cmd:maintain",
    "replay-dead-letters": "ingest.cli.replay_cmd:replay_dead_letters",
}


class LazyGroup(click.Group):
    """A group whose subcommands (SUBCOMMANDS) are imported on first use (click's documented lazy-loading group)."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*super().list_commands(ctx), *SUBCOMMANDS})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in SUBCOMMANDS:
            return super().get_command(ctx, cmd_name)
        module, attribute = SUBCOMMANDS[cmd_name].split(":")
        command: Any = getattr(importlib.import_module(module), attribute)
        if not isinstance(command, click.Command):
            raise TypeError(f"{SUBCOMMANDS[cmd_name]} is not a click command")
        return command


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
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
    ctx.obj = {**(ctx.obj or {}), "config_path": config_path}


def main() -> None:
    try:
        result = cli.main(standalone_mode=False, obj={"own_process": True})
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
