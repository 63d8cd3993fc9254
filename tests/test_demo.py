"""`make demo` (`cdclake demo`), the README's first command, run as a user runs it: broker, fake Db2, Informix,
Oracle and MongoDB streams, ingest, scaffold, `dbt build`, and its own check of silver against each source's final
state; then `cdclake demo --more`, which applies another round incrementally. In a child process: the demo starts
Spark with the shipped settings (the JIT of short runs aside) on a lakehouse of its own."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from ingest.lakehouse import PROJECT_ROOT
from tests.processes import SUBPROCESS_TIMEOUT_S, subprocess_env

pytestmark = [pytest.mark.spark, pytest.mark.kafka]

# `cdclake demo` and then `cdclake demo --more`, in one process (the second reuses the first's SparkSession), on a
# project root of the test's: what the command runs on the repository's root.
RUN_TWICE = """
import sys
from pathlib import Path
from ingest.demo import run
root = Path(sys.argv[1])
sys.exit(0 if run(root) and run(root, rounds_delta=1) else 1)
"""


def test_the_demo_applies_two_rounds_and_checks_silver(tmp_path: Path) -> None:
    project = tmp_path / "dbt_project"
    ignore = shutil.ignore_patterns("target", "dbt_packages", "logs", "package-lock.yml")
    shutil.copytree(PROJECT_ROOT / "dbt_project", project, ignore=ignore)
    (project / "packages.yml").write_text(f"packages:\n  - local: {PROJECT_ROOT / 'dbt_cdclake'}\n")
    models = sorted(path.name for path in (project / "models" / "silver").glob("*.sql"))
    done = subprocess.run(
        [sys.executable, "-c", RUN_TWICE, str(tmp_path)],
        cwd=tmp_path,
        env={**subprocess_env(tmp_path), "COLUMNS": "120"},
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=SUBPROCESS_TIMEOUT_S,
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-6000:]
    # Each round: the four sources' silver tables equal their final state (the demo's own check, which fails it).
    assert output.count("silver vs. the source tables' final state") == 2, output[-6000:]
    assert output.count("equal") >= 8
    assert "round 0" in output
    assert "round 1" in output
    assert "differences" not in output
    # The reference project's models are the demo's: scaffold writes none, the second round none either.
    assert output.count("scaffold: 0 file(s) written") == 2, output[-6000:]
    assert sorted(path.name for path in (project / "models" / "silver").glob("*.sql")) == models
    assert (tmp_path / "lakehouse" / "cdclake-demo.yml").is_file()
