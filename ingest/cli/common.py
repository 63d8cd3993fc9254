"""Shared by the subcommands: the --config option, and the settings loaded once per invocation."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import click

from ingest.config import Settings, load_settings, redact
from ingest.logs import redact_logs

F = TypeVar("F", bound=Callable[..., object])
CONFIG_HELP = "cdclake.yml to use (default: $CDCLAKE_CONFIG, then ./cdclake.yml, then embedded defaults)."


def config_option(command: F) -> F:
    """``--config FILE`` after the subcommand too (``cdclake ingest --config FILE``), as before it
    (``cdclake --config FILE ingest``); given in both places, the subcommand's wins."""

    def remember(ctx: click.Context, _param: click.Parameter, value: str | None) -> None:
        if value is not None:
            root = ctx.find_root()
            if root.obj is None:
                root.obj = {}
            root.obj["config_path"] = value

    return click.option(
        "--config",
        type=click.Path(dir_okay=False),
        expose_value=False,
        callback=remember,
        help=CONFIG_HELP,
    )(command)


def settings_from(ctx: click.Context) -> Settings:
    obj = ctx.find_root().obj or {}
    cached = obj.get("settings")
    if cached is None:
        cached = obj["settings"] = load_settings(obj.get("config_path"))
        loaded = cached
        redact_logs(lambda text: redact(text, loaded))
    assert isinstance(cached, Settings)
    return cached


def own_process(ctx: click.Context) -> bool:
    """Whether cdclake runs as its own process (the `cdclake` command), not called by other Python code, which
    may hold a SparkSession of its own that a session started for this command's settings would stand in for."""
    obj = ctx.find_root().obj or {}
    return bool(obj.get("own_process"))
