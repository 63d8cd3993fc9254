"""docs/configuration.md is generated from the settings model and must not drift from it."""

from __future__ import annotations

import functools
import importlib.util
import subprocess
import sys
import typing
from pathlib import Path
from types import ModuleType

from pydantic import BaseModel

from ingest.config import ENV_PREFIX, Settings

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "gen_config_docs.py"
DOC = ROOT / "docs" / "configuration.md"


@functools.cache
def generator() -> ModuleType:
    """scripts/gen_config_docs.py as a module (scripts/ is not a package)."""
    spec = importlib.util.spec_from_file_location("gen_config_docs", SCRIPT)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_configuration_reference_is_up_to_date() -> None:
    expected = generator().render()
    assert DOC.read_text() == expected, f"{DOC} is out of date: run `.venv/bin/python scripts/gen_config_docs.py`"


def test_every_setting_is_documented_with_its_environment_name() -> None:
    text = DOC.read_text()
    for section, field in Settings.model_fields.items():
        if not field.exclude:
            assert f"## `{section}`" in text
    paths = leaf_paths(Settings)
    assert len(paths) > 30
    assert sorted(paths) == sorted(setting.path for setting in generator().walk(Settings))
    for path in paths:
        assert f"| `{'.'.join(path)}` |" in text
        assert f"`{ENV_PREFIX}{'__'.join(part.upper() for part in path)}`" in text


def leaf_paths(model: type[BaseModel], prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    """Every setting of ``model`` a file can hold, found here rather than by the generator the test checks: a field
    whose type holds a settings model (``X``, ``X | None``, ``Optional[X]``) is a section, any other a setting."""
    paths: list[tuple[str, ...]] = []
    for name, field in model.model_fields.items():
        if field.exclude:
            continue
        nested = [
            arg
            for arg in (field.annotation, *typing.get_args(field.annotation))
            if isinstance(arg, type) and issubclass(arg, BaseModel)
        ]
        if nested:
            paths += leaf_paths(nested[0], (*prefix, name))
        else:
            paths.append((*prefix, name))
    return paths


def test_check_mode(tmp_path: Path) -> None:
    check = [sys.executable, str(SCRIPT), "--check"]
    assert subprocess.run(check, capture_output=True, text=True).returncode == 0
    stale = tmp_path / "configuration.md"
    stale.write_text("# stale\n")
    run = subprocess.run([*check, "--output", str(stale)], capture_output=True, text=True)
    assert run.returncode == 1
    assert "out of date" in run.stderr
    assert stale.read_text() == "# stale\n"  # --check never writes
    written = subprocess.run([sys.executable, str(SCRIPT), "--output", str(stale)], capture_output=True, text=True)
    assert written.returncode == 0, written.stderr
    assert stale.read_text() == DOC.read_text()


def test_a_benchmark_rewrites_only_its_own_section(tmp_path: Path) -> None:
    """Each benchmark replaces its `## ` section of docs/benchmarks.md; the others stay byte for byte."""
    from bench.docs import replace_section

    path = tmp_path / "benchmarks.md"
    replace_section("## Merge (silver)", "## Merge (silver)\n\nm1\n", path)
    replace_section("## Ingest", "## Ingest\n\ni1\n", path)
    assert path.read_text() == "# Benchmarks\n\n## Merge (silver)\n\nm1\n\n## Ingest\n\ni1\n"
    replace_section("## Merge (silver)", "## Merge (silver)\n\nm2\n| a | b |\n", path)
    assert path.read_text() == "# Benchmarks\n\n## Merge (silver)\n\nm2\n| a | b |\n\n## Ingest\n\ni1\n"
    replace_section("## Ingest", "## Ingest\n\ni2\n", path)
    assert path.read_text() == "# Benchmarks\n\n## Merge (silver)\n\nm2\n| a | b |\n\n## Ingest\n\ni2\n"


def test_each_benchmark_section_links_its_notes_by_hand() -> None:
    """A `--write` run replaces its section of docs/benchmarks.md whole, so the notes written by hand on the runs
    live in docs/benchmark-notes.md under the same headings, and each generated section ends with a link there."""
    import re

    from bench.docs import BENCHMARKS_DOC, NOTES_DOC, notes_line

    assert notes_line("## Merge (silver)").endswith("(benchmark-notes.md#merge-silver).")
    text = BENCHMARKS_DOC.read_text()
    sections = re.findall(r"^(## .+?)[ \t]*\n(.*?)(?=^## |\Z)", text, flags=re.MULTILINE | re.DOTALL)
    assert [heading for heading, _ in sections] == ["## Ingest", "## Merge (silver)"]
    for heading, body in sections:
        assert body.rstrip("\n").endswith(notes_line(heading)), heading
        assert "written by hand" not in body.lower(), f"{heading}: notes by hand belong in {NOTES_DOC.name}"
    notes_headings = re.findall(r"^## .+$", NOTES_DOC.read_text(), flags=re.MULTILINE)
    assert notes_headings == [heading for heading, _ in sections]


def test_configuration_examples_in_the_docs_validate(tmp_path: Path) -> None:
    """Every cdclake.yml example (a YAML block whose top-level keys are settings sections) loads as written, with
    the environment variables it references set: a copied example must not fail validation."""
    import re

    import yaml

    from ingest.config import load_settings

    checked = 0
    for doc in (ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))):
        for number, block in enumerate(re.findall(r"```yaml\n(.*?)```", doc.read_text(), re.S)):
            document = yaml.safe_load(block)
            if not isinstance(document, dict) or not document.keys() <= Settings.model_fields.keys():
                continue  # a dbt profile or model config, not a cdclake.yml
            path = tmp_path / f"{doc.stem}-{number}.yml"
            path.write_text(block)
            environ = {name: "not-a-secret" for name in re.findall(r"\$\{(\w+)\}", block)}
            load_settings(path, environ=environ)  # raises ConfigError naming the key
            checked += 1
    assert checked >= 6
