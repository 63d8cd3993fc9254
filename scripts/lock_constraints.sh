#!/usr/bin/env bash
# constraints.txt: the exact version of every Python package the project installs (`make setup`, the Debezium
# engine of `make test`, the ingest image). Resolved afresh in a scratch virtualenv, so nothing installed by hand
# into .venv is pinned: ./lock_constraints.sh PYTHON [REQUIREMENT ...]. Run `make lock`, then `make test`, and commit both together.
set -euo pipefail
PYTHON="${1:-python3.11}"
shift || true  # the rest: more requirements to resolve with the project's (the Debezium engine)
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
SCRATCH="$(mktemp -d)"
trap 'rm -rf "$SCRATCH"' EXIT

"$PYTHON" -m venv "$SCRATCH/venv"
"$SCRATCH/venv/bin/python" -m pip install -q --upgrade pip
# The project's dependencies with every extra, and the Debezium engine (Makefile: DEBEZIUM_ENGINE).
"$SCRATCH/venv/bin/python" -m pip install -q "$ROOT[dev,runtime,sources]" "$@"
{
  echo "# Exact versions of everything the project installs: make setup, the Debezium engine and the ingest image"
  echo "# install with -c constraints.txt. Regenerate with \`make lock\` (scripts/lock_constraints.sh), then run \`make test\`."
  "$SCRATCH/venv/bin/python" -m pip freeze --exclude cdclake
} > "$ROOT/constraints.txt.new"
mv "$ROOT/constraints.txt.new" "$ROOT/constraints.txt"
echo "[lock] constraints.txt: $(grep -c '==' "$ROOT/constraints.txt") packages" >&2
