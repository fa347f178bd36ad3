#!/usr/bin/env bash
# Set up everything itertrace needs on a fresh Debian bookworm machine:
# Nsight Systems (Debian non-free), a virtual environment in .venv, and the package with its dev extras;
# with --tests also Chromium (a test renders the HTML report in it).
# Idempotent: a second run only checks. Run by scripts/demo and scripts/test.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

# can_apt TOOL CONSEQUENCE: whether apt-get can install TOOL here (root with apt-get); says what follows if not.
can_apt() {
  if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
    echo "setup: $1 not found and cannot apt-get here; $2" >&2
    return 1
  fi
}

install_nsys() {
  command -v nsys >/dev/null 2>&1 && return 0
  can_apt nsys "nsys tests will skip" || return 0
  echo "setup: installing Nsight Systems from Debian non-free" >&2
  cat > /etc/apt/sources.list.d/itertrace-nonfree.sources <<'SRC'
Types: deb
URIs: http://deb.debian.org/debian
Suites: bookworm bookworm-updates
Components: contrib non-free
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
SRC
  apt-get update -qq >/dev/null
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
    nsight-systems-target nsight-systems >/dev/null
}

install_chromium() {
  command -v chromium >/dev/null 2>&1 && return 0
  can_apt chromium "the report's browser test will skip" || return 0
  echo "setup: installing Chromium from Debian" >&2
  apt-get update -qq >/dev/null
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium >/dev/null
}

install_venv() {
  local venv="$root/.venv" stamp="$root/.venv/.itertrace-setup"
  [ -x "$venv/bin/python" ] || python3 -m venv "$venv"
  # Reinstall only when pyproject.toml changed since the last set-up.
  if [ ! -f "$stamp" ] || [ "$root/pyproject.toml" -nt "$stamp" ]; then
    echo "setup: installing Python packages into .venv" >&2
    # torch pinned first: this exact version lies on disk as a CPU wheel; an open range pulls a CUDA build.
    "$venv/bin/pip" install -q --disable-pip-version-check torch==2.13.0 2>&1 | grep -v '^WARNING: Location' || true
    "$venv/bin/pip" install -q --disable-pip-version-check -e "$root[dev]" 2>&1 | grep -v '^WARNING: Location' || true
    "$venv/bin/python" -c "import itertrace, torch, duckdb" || { echo "setup: package install failed" >&2; exit 1; }
    touch "$stamp"
  fi
}

install_nsys
if [ "${1:-}" = "--tests" ]; then install_chromium; fi
install_venv
