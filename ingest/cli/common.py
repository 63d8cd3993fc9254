"""Shared by the subcommands: load settings once per invocation."""

from __future__ import annotations

import click

from ingest.config import Settings, load_settings


def settings_from(ctx: click.Context) -> Settings:
    obj = ctx.find_root().obj or {}
    cached = obj.get("settings")
    if cached is None:
        cached = obj["settings"] = load_settings(obj.get("config_path"))
    assert isinstance(cached, Settings)
    return cached
