"""`cdclake dbt ARGS...`: dbt with the project and the profile generated from cdclake.yml preset."""

from __future__ import annotations

import click

from ingest.cli.common import config_option, own_process, settings_from


@click.command(context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
@config_option
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
@click.pass_context
def dbt(ctx: click.Context, args: tuple[str, ...]) -> int:
    """Run dbt (default: build) on the configured project with the lakehouse profile."""
    from ingest.dbt_runner import run_dbt, sends_queries, start_session_beside
    from ingest.lakehouse import check_catalog_reachable

    dbt_args = _take_config(ctx, args)  # before the settings are loaded: it may name their file
    settings = settings_from(ctx)
    if sends_queries(dbt_args):
        check_catalog_reachable(settings)  # before Spark (or the Thrift Server) opens it
    if own_process(ctx):
        start_session_beside(settings, dbt_args)
    return 0 if run_dbt(settings, dbt_args) else 1


def _take_config(ctx: click.Context, args: tuple[str, ...]) -> list[str]:
    """dbt's arguments without cdclake's ``--config FILE`` among them (``cdclake dbt build --config FILE``: dbt has
    no such option, and after the first dbt argument click hands everything to dbt)."""
    kept: list[str] = []
    rest = iter(args)
    for arg in rest:
        if arg == "--config":
            path = next(rest, None)
            if path is None:
                raise click.UsageError("--config needs a file")
            ctx.find_root().obj["config_path"] = path
        elif arg.startswith("--config="):
            ctx.find_root().obj["config_path"] = arg.removeprefix("--config=")
        else:
            kept.append(arg)
    return kept


@click.command("dbt-profile")
@config_option
@click.pass_context
def dbt_profile(ctx: click.Context) -> int:
    """Write the dbt profile (for plain `dbt ... --profiles-dir`) and print where it is."""
    from ingest.dbt_runner import secret_environment, write_profile

    settings = settings_from(ctx)
    written = write_profile(settings)
    names = sorted(secret_environment(settings))
    if names:  # on stderr, first: scripts read the directory from stdout
        click.echo(f"plain dbt reads the secrets from the environment: set {', '.join(names)}", err=True)
    click.echo(str(written.parent))
    return 0
