"""The ingest container, without a Docker engine: the Dockerfile's contract, and what the image runs, as processes.

- the Dockerfile: non-root user, health check on /healthz, entry point and command, config location;
- the lean image: `cdclake ingest` runs with only requirements-ingest.txt (no pyspark, no dbt importable);
- the service: configured from the environment alone, healthy, counting in /metrics, idle after draining, and
  leaving cleanly (exit 0, a final JSON log line) on SIGTERM; every log line is JSON.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
import tomllib
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from ingest.config import CONFIG_ENV, ENV_PREFIX, load_settings

ROOT = Path(__file__).resolve().parent.parent
DOCKERFILE = ROOT / "Dockerfile"
PG_DUMP = ROOT / "tests" / "fixtures" / "debezium" / "postgres" / "dbserver1.jsonl"
# Installed with the full project but not in the ingest image.
NOT_IN_IMAGE = ("pyspark", "py4j", "dbt", "ibm_db", "oracledb", "pymongo", "hypothesis")
STARTUP_TIMEOUT_S = 60.0
EXIT_TIMEOUT_S = 5.0


# -- the Dockerfile ------------------------------------------------------------------------------------------------
def dockerfile_instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs: comments dropped, backslash continuations joined."""
    instructions: list[tuple[str, str]] = []
    pending = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if pending and line.startswith("#"):
            continue  # a comment inside a continued instruction
        if line.endswith("\\"):
            pending += line[:-1].strip() + " "
            continue
        whole = (pending + line).strip()
        pending = ""
        keyword, _, arguments = whole.partition(" ")
        assert keyword.isalpha(), f"not a Dockerfile instruction: {whole!r}"
        instructions.append((keyword.upper(), arguments.strip()))
    assert not pending, "the Dockerfile ends inside a continued line"
    return instructions


def only(instructions: list[tuple[str, str]], keyword: str) -> str:
    found = [arguments for name, arguments in instructions if name == keyword]
    assert len(found) == 1, f"expected one {keyword}, found {len(found)}"
    return found[0]


def env_of(instructions: list[tuple[str, str]]) -> dict[str, str]:
    env: dict[str, str] = {}
    for name, arguments in instructions:
        if name == "ENV":
            for item in shlex.split(arguments):
                key, _, value = item.partition("=")
                env[key] = value
    return env


def test_dockerfile_contract() -> None:
    instructions = dockerfile_instructions(DOCKERFILE.read_text())
    keywords = [name for name, _ in instructions]
    known = {"ARG", "FROM", "ENV", "COPY", "RUN", "WORKDIR", "USER", "EXPOSE", "HEALTHCHECK", "STOPSIGNAL"}
    assert set(keywords) <= known | {"ENTRYPOINT", "CMD"}, keywords

    # The base image, overridable for a registry mirror.
    assert only(instructions, "ARG") == "BASE_IMAGE=python:3.11-slim"
    assert only(instructions, "FROM") == "${BASE_IMAGE}"
    user = only(instructions, "USER").split(":")[0]
    assert user not in ("root", "0")
    assert user == "10001"
    assert only(instructions, "WORKDIR") == "/app"
    assert only(instructions, "EXPOSE") == "9108"
    assert only(instructions, "STOPSIGNAL") == "SIGTERM"
    assert json.loads(only(instructions, "ENTRYPOINT")) == ["cdclake", "--log-format", "json"]
    assert json.loads(only(instructions, "CMD")) == ["ingest"]
    # The user is switched to after everything that needs root, and before the process starts.
    assert keywords.index("USER") > max(i for i, name in enumerate(keywords) if name == "RUN")

    options, _, check = only(instructions, "HEALTHCHECK").partition(" CMD ")
    assert options.startswith("--")
    probe = json.loads(check)
    assert probe[:2] == ["python", "-c"]
    assert "urllib.request" in probe[2]
    compile(probe[2], "<healthcheck>", "exec")

    env = env_of(instructions)
    assert env[CONFIG_ENV] == "/etc/cdclake/cdclake.yml"
    assert env[f"{ENV_PREFIX}INGEST__METRICS_PORT"] == "9108"  # what EXPOSE documents
    # The probe asks the port that variable names: moved with `docker run -e`, the health check follows it.
    with port_serving_healthz() as port:
        assert probe_exit_code(probe[2], port) == 0
    assert probe_exit_code(probe[2], str(free_port())) != 0  # nothing listens there

    runs = " ".join(arguments for name, arguments in instructions if name == "RUN")
    assert "pip install -c /tmp/constraints.txt -r /tmp/requirements-ingest.txt" in runs
    assert "pip install --no-deps" in runs
    assert not re.search(r"openjdk|default-jre|apt-get install", runs), "the ingest image needs no JVM"
    for name, arguments in instructions:
        if name == "COPY":
            for source in shlex.split(arguments)[:-1]:
                assert (ROOT / source).exists(), f"COPY source {source} is missing"


@contextlib.contextmanager
def port_serving_healthz() -> Iterator[str]:
    """A port on which a thread answers GET /healthz with 200."""
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    class Healthz(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # the name http.server calls
            self.send_response(200 if self.path == "/healthz" else 404)
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    with ThreadingHTTPServer(("127.0.0.1", 0), Healthz) as server:
        threading.Thread(target=server.serve_forever, daemon=True).start()
        try:
            yield str(server.server_address[1])
        finally:
            server.shutdown()


def probe_exit_code(code: str, port: str) -> int:
    env = {**os.environ, f"{ENV_PREFIX}INGEST__METRICS_PORT": port}
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, timeout=30).returncode


def test_dockerignore_keeps_the_context_small() -> None:
    lines = [line for line in (ROOT / ".dockerignore").read_text().splitlines() if line and line[0] != "#"]
    assert lines[0] == "*"  # an allow-list: .venv, lakehouse/ and .cdclake/ never reach the build context
    allowed = {line[1:].rstrip("/") for line in lines if line.startswith("!")}
    copied = {"requirements-ingest.txt", "constraints.txt", "pyproject.toml", "README.md", "ingest"}
    assert copied <= allowed


def requirement_lines(path: Path) -> list[str]:
    return [line.strip() for line in path.read_text().splitlines() if line.strip() and not line.startswith("#")]


def test_ingest_requirements_are_a_subset_of_the_project() -> None:
    dependencies = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    lean = requirement_lines(ROOT / "requirements-ingest.txt")
    assert lean
    assert set(lean) <= set(dependencies), set(lean) - set(dependencies)
    assert not any(name in line for line in lean for name in ("pyspark", "dbt"))


def distribution_name(requirement: str) -> str:
    """A requirement's project name, normalized (PEP 503): ``PyYAML>=6`` -> ``pyyaml``."""
    name = re.match(r"[A-Za-z0-9._-]+", requirement.strip())
    assert name is not None, requirement
    return re.sub(r"[-_.]+", "-", name.group(0)).lower()


def test_constraints_pin_every_dependency_at_the_version_installed() -> None:
    """constraints.txt (make setup, the Debezium engine, the image) pins each package the project asks for, and the
    suite runs with exactly those versions: what the image installs is what was tested. A dependency added to
    pyproject.toml without `make lock` fails here."""
    from importlib.metadata import PackageNotFoundError, version

    pins = {
        distribution_name(line): line.partition("==")[2]
        for line in requirement_lines(ROOT / "constraints.txt")
        if "==" in line
    }
    assert len(pins) == len(requirement_lines(ROOT / "constraints.txt")), "only name==version lines"
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    wanted = [*project["dependencies"], *(r for extra in project["optional-dependencies"].values() for r in extra)]
    makefile = (ROOT / "Makefile").read_text()
    engine = re.search(r"^DEBEZIUM_ENGINE := (.+)$", makefile, re.MULTILINE)
    assert engine is not None
    wanted += shlex.split(engine.group(1))
    unpinned = {distribution_name(r) for r in wanted} - pins.keys()
    assert not unpinned, f"not in constraints.txt (run make lock): {sorted(unpinned)}"
    different = {}
    for name, pinned in pins.items():
        try:
            installed = version(name)
        except PackageNotFoundError:
            continue  # e.g. the Debezium engine, before `make test` installs it
        if installed != pinned:
            different[name] = (pinned, installed)
    assert not different, f"installed versions differ from constraints.txt (pinned, installed): {different}"
    assert "-c constraints.txt -e '.[$(EXTRAS)]'" in makefile
    assert "EXTRAS ?= dev,runtime,sources\n" in makefile
    assert "-c constraints.txt $(DEBEZIUM_ENGINE)" in makefile


# -- the lean image ---------------------------------------------------------------------------------------------------
BLOCKER = textwrap.dedent(
    """
    import importlib.abc, sys

    class NotInImage(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in {blocked!r}:
                raise ImportError(f"{{name}} is not in the ingest image")
            return None

    sys.meta_path.insert(0, NotInImage())
    from ingest.cli import main
    sys.argv = ["cdclake", *sys.argv[1:]]
    main()
    """
).format(blocked=set(NOT_IN_IMAGE))


def service_env(tmp_path: Path, **overrides: str) -> dict[str, str]:
    """The process environment with the configuration from CDCLAKE__* variables only (no file anywhere)."""
    env = {key: value for key, value in os.environ.items() if not key.startswith("CDCLAKE")}
    env.update(
        {
            f"{ENV_PREFIX}SOURCE__TYPE": "file",
            f"{ENV_PREFIX}SOURCE__PATH": str(PG_DUMP),
            f"{ENV_PREFIX}LAKEHOUSE__WAREHOUSE": str(tmp_path / "warehouse"),
            f"{ENV_PREFIX}LAKEHOUSE__CATALOG_URI": f"sqlite:///{tmp_path / 'catalog.db'}",
            f"{ENV_PREFIX}INGEST__LATENCY_THRESHOLD_S": "0.2",
            **overrides,
        }
    )
    return env


def dump_records() -> int:
    return sum(1 for line in PG_DUMP.read_bytes().splitlines() if line.strip())


def test_ingest_runs_without_spark_or_dbt(tmp_path: Path) -> None:
    """What requirements-ingest.txt installs is enough: every command registers, and ingest works."""
    env = service_env(tmp_path)
    help_run = subprocess.run(
        [sys.executable, "-c", BLOCKER, "ingest", "--help"], env=env, cwd=tmp_path, capture_output=True, text=True
    )
    assert help_run.returncode == 0, help_run.stderr
    assert "--once" in help_run.stdout
    run = subprocess.run(
        [sys.executable, "-c", BLOCKER, "--log-format", "json", "ingest", "--once"],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stderr
    summary = json.loads(run.stderr.strip().splitlines()[-1])
    assert summary["records_in"] == dump_records()
    assert summary["written"] > 0


# -- the service --------------------------------------------------------------------------------------------------
def cdclake_command() -> str:
    beside = Path(sys.executable).parent / "cdclake"
    assert beside.is_file(), "the cdclake script is not installed (make setup)"
    return str(beside)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def http_get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


def counter_total(metrics_text: str, family: str) -> float:
    for metric in text_string_to_metric_families(metrics_text):
        if metric.name == family:
            return sum(sample.value for sample in metric.samples if sample.name == f"{family}_total")
    return 0.0


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime


@dataclass
class Service:
    """`cdclake --log-format json ingest` as a child process, its stderr lines collected by a thread."""

    process: subprocess.Popen[str]
    port: int
    stderr: list[str] = field(default_factory=list)

    @classmethod
    def start(cls, tmp_path: Path) -> Service:
        port = free_port()
        env = service_env(tmp_path, **{f"{ENV_PREFIX}INGEST__METRICS_PORT": str(port)})
        assert CONFIG_ENV not in env
        assert not (tmp_path / "cdclake.yml").exists()
        process = subprocess.Popen(
            [cdclake_command(), "--log-format", "json", "ingest"],
            env=env,
            cwd=tmp_path,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        service = cls(process, port)
        threading.Thread(target=service._read, daemon=True).start()
        return service

    def _read(self) -> None:
        assert self.process.stderr is not None
        for line in self.process.stderr:
            self.stderr.append(line)

    def get(self, path: str) -> tuple[int, str]:
        return http_get(f"http://127.0.0.1:{self.port}{path}")

    def wait_until(self, done: Callable[[], bool], what: str, timeout_s: float = STARTUP_TIMEOUT_S) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            assert self.process.poll() is None, f"the service exited ({self.process.returncode}) before {what}:\n" + (
                "".join(self.stderr[-20:])
            )
            try:
                if done():
                    return
            except OSError:
                pass  # not listening yet
            time.sleep(0.1)
        raise AssertionError(f"timed out waiting for {what}:\n" + "".join(self.stderr[-20:]))

    def drained(self) -> bool:
        _, text = self.get("/metrics")
        return counter_total(text, "cdclake_records_in") >= dump_records() and (
            counter_total(text, "cdclake_records_written") > 0
        )

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(10)


@dataclass
class ServiceRun:
    healthz: tuple[int, str]
    metrics: str
    idle_cpu_s: float
    idle_s: float
    exit_code: int | None
    exit_s: float
    stdout: str
    stderr: list[str]


@pytest.fixture(scope="module")
def service_run(tmp_path_factory: pytest.TempPathFactory) -> ServiceRun:
    """One life of the service: start, healthy, drain the dump, idle a while, SIGTERM."""
    service = Service.start(tmp_path_factory.mktemp("service"))
    try:
        service.wait_until(lambda: service.get("/healthz")[0] == 200, "/healthz to answer 200")
        healthz = service.get("/healthz")
        service.wait_until(service.drained, "the dump to be ingested")
        # Caught up, no --once: the service must stay up and wait for more, like a consumer.
        time.sleep(0.5)
        idle_cpu, idle_started = cpu_seconds(service.process.pid), time.monotonic()
        time.sleep(2.0)
        idle_cpu, idle_s = cpu_seconds(service.process.pid) - idle_cpu, time.monotonic() - idle_started
        assert service.process.poll() is None, "the file source exited after draining without --once"
        _, metrics = service.get("/metrics")
        signalled = time.monotonic()
        service.process.send_signal(signal.SIGTERM)
        try:
            exit_code: int | None = service.process.wait(EXIT_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            exit_code = None
        exit_s = time.monotonic() - signalled
    finally:
        service.stop()
    assert service.process.stdout is not None
    stdout = service.process.stdout.read()
    time.sleep(0.1)  # the reader thread sees EOF right after the process ends
    return ServiceRun(healthz, metrics, idle_cpu, idle_s, exit_code, exit_s, stdout, list(service.stderr))


def test_service_is_healthy_and_counts(service_run: ServiceRun) -> None:
    assert service_run.healthz == (200, "ok\n")
    records_in = counter_total(service_run.metrics, "cdclake_records_in")
    written = counter_total(service_run.metrics, "cdclake_records_written")
    dead = counter_total(service_run.metrics, "cdclake_dead_letters")
    skipped = counter_total(service_run.metrics, "cdclake_records_skipped")
    assert records_in == dump_records()
    assert written > 0
    assert written + dead + skipped == records_in


def test_sigterm_exits_cleanly_with_a_final_log_line(service_run: ServiceRun) -> None:
    assert service_run.exit_code == 0, f"exit code {service_run.exit_code}:\n" + "".join(service_run.stderr[-10:])
    assert service_run.exit_s < EXIT_TIMEOUT_S
    entries = [json.loads(line) for line in service_run.stderr if line.strip()]
    assert any(entry["msg"].startswith("received SIGTERM") for entry in entries)
    final = entries[-1]
    assert final["level"] == "info"
    assert final["msg"].startswith(f"ingested {dump_records()} records")
    assert final["records_in"] == dump_records()
    assert final["written"] > 0
    assert final["written"] + final["dead_letters"] + final["skipped"] == final["records_in"]


def test_logs_are_json_lines(service_run: ServiceRun) -> None:
    assert service_run.stdout == ""
    lines = [line for line in service_run.stderr if line.strip()]
    assert len(lines) >= 3
    for line in lines:
        entry = json.loads(line)
        assert isinstance(entry, dict), line
        assert {"ts", "level", "logger", "msg"} <= entry.keys(), line
        assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", entry["ts"]), line
    assert any("serving /metrics and /healthz on port" in line for line in lines)


def test_idle_service_does_not_spin(service_run: ServiceRun) -> None:
    # Caught up and waiting, the service should sleep in poll(): a few milliseconds of CPU per second at most.
    assert service_run.idle_cpu_s < 0.2 * service_run.idle_s, f"{service_run.idle_cpu_s:.2f}s CPU while idle"


# -- the compose example ----------------------------------------------------------------------------------------
def test_compose_example_and_its_config() -> None:
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    services = compose["services"]
    assert {"kafka", "catalog-db", "ingest", "dbt"} <= services.keys()
    ingest = services["ingest"]
    assert "./deploy/cdclake.yml:/etc/cdclake/cdclake.yml:ro" in ingest["volumes"]
    assert "warehouse:/warehouse" in ingest["volumes"]
    assert "warehouse:/warehouse" in services["dbt"]["volumes"]
    assert "ICEBERG_DB_PASSWORD" in ingest["environment"]
    assert "warehouse" in compose["volumes"]
    # The dbt job scaffolds models for the deployment's own bronze tables, then builds them, in a project without
    # the demo's models (whose bronze tables a deployment does not have: every build failed).
    dbt = services["dbt"]
    project = Path(dbt["environment"]["CDCLAKE__DBT__PROJECT_DIR"].replace("/repo", str(ROOT), 1))
    assert project == ROOT / "deploy" / "dbt_project"
    assert not list(project.rglob("*.sql"))
    packages = yaml.safe_load((project / "packages.yml").read_text())["packages"]
    assert (project / packages[0]["local"] / "dbt_project.yml").is_file()
    command = dbt["command"][-1]
    assert "make setup EXTRAS=runtime &&" in command  # the job needs Spark and dbt, not the linters
    assert command.index("cdclake scaffold") < command.index("cdclake dbt build")

    settings = load_settings(ROOT / "deploy" / "cdclake.yml", environ={"ICEBERG_DB_PASSWORD": "not-a-secret"})
    assert settings.lakehouse.warehouse == "/warehouse"
    uri = settings.lakehouse.catalog_uri.get_secret_value()
    assert uri == "postgresql+psycopg2://iceberg:not-a-secret@catalog-db:5432/iceberg"
    source = settings.require_source()
    assert source.type == "kafka"
    assert source.bootstrap_servers == "kafka:9092"
    assert source.topic_pattern
    assert settings.ingest.metrics_port == 9108


def test_a_broken_venv_is_made_again_in_place(tmp_path: Path) -> None:
    """docker-compose.yml mounts a volume at the project's .venv: setup must empty a venv it makes again, not remove
    the directory (removing a mount point fails, and every `docker compose run dbt` failed with it)."""
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "left-by-a-failed-attempt").write_text("")
    inode = venv.stat().st_ino
    script = ROOT / "scripts" / "setup_venv.sh"
    subprocess.run(["bash", str(script), "python3.11", str(venv)], check=True, stdin=subprocess.DEVNULL)
    assert venv.stat().st_ino == inode
    assert not (venv / "left-by-a-failed-attempt").exists()
    subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "--version"], check=True, capture_output=True)
