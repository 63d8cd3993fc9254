#!/usr/bin/env bash
# The project's virtualenv: ./setup_venv.sh PYTHON VENV. Idempotent: a venv whose pip works is kept.
#
# On Debian, `python3.X -m venv` needs the python3.X-venv package (ensurepip): installed here when missing
# (as root, or through sudo). A venv an earlier failed attempt left without pip is made again, instead of
# failing every later run.
set -euo pipefail
PYTHON="${1:-python3.11}"
VENV="${2:-.venv}"

log() { echo "[setup_venv] $*" >&2; }

if [[ -x "$VENV/bin/python" ]] && "$VENV/bin/python" -m pip --version >/dev/null 2>&1; then
  exit 0
fi
command -v "$PYTHON" >/dev/null 2>&1 || { log "ERROR: $PYTHON not found (Python 3.11 is required)"; exit 1; }
if ! "$PYTHON" -c 'import ensurepip' >/dev/null 2>&1; then
  package="python$("$PYTHON" -c 'import sys; print("%d.%d" % sys.version_info[:2])')-venv"
  SUDO=()
  if [[ $(id -u) -ne 0 ]]; then
    command -v sudo >/dev/null 2>&1 || { log "ERROR: need root (or sudo) to install $package"; exit 1; }
    SUDO=(sudo -n)
  fi
  log "apt-get install $package"
  "${SUDO[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -qq </dev/null >&2
  "${SUDO[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$package" </dev/null >&2
fi
# Emptied, not removed: the directory may be a mount point (docker-compose.yml mounts a volume there).
if [[ -d "$VENV" ]]; then
  find "$VENV" -mindepth 1 -maxdepth 1 -exec rm -rf {} +
fi
log "creating $VENV with $PYTHON"
"$PYTHON" -m venv "$VENV"
