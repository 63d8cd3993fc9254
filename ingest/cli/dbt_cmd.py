"""`cdclake dbt ARGS...`: dbt with the project and the profile generated from cdclake.yml preset."""

from __future__ import annotations

import click

from ingest.cli.common import config_option, settings_from


@click.command(context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
@config_option
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
@click.pass_context
def dbt(ctx: click.Context, args: tuple[str, ...]) -> int:
    """Run dbt (default: build) on the configured project with the lakehouse profile."""
    from ingest.dbt_runner import run_dbt

    return 0 if run_dbt(settings_from(ctx), args) else 1


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
