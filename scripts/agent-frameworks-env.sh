#!/usr/bin/env bash
# Installs (or reuses) the third-party agent frameworks the agent_program tests run
# inside sandboxes: the `openai` SDK, LiteLLM and mini-swe-agent, pinned, into one
# directory for the interpreter sandboxes run (/usr/bin/python3: a bubblewrap sandbox
# sees the host's /usr, not a pyenv or a venv in a home directory). The tests bind that
# directory read-only into their sandboxes (sandbox.ro_binds) and put it on PYTHONPATH,
# as an operator would for an agent installed outside /usr. Prints progress on stderr
# and the directory on the last line of stdout.
#
# Cold: about 30 seconds and 0.7 GB (mini-swe-agent pulls LiteLLM, which pulls
# datasets, pandas and pyarrow). Warm (already complete): instant.
#
# Environment:
#   ROLLOUT_AGENT_SITE   where the packages go (default: /var/cache/rollout/agent-frameworks-<pins>
#                        for root, whose sandboxes run as users of their own that cannot enter
#                        /root; ${XDG_CACHE_HOME:-$HOME/.cache}/rollout/... for anyone else,
#                        whose sandboxes run as themselves)
#   SANDBOX_PYTHON       the sandboxes' interpreter (default /usr/bin/python3)
set -euo pipefail

PINS="openai==3.57.0 litellm==1.110.2 mini-swe-agent==2.4.6"
TAG="$(printf '%s' "$PINS" | sha256sum | cut -c1-12)"
if [[ "$(id -u)" = 0 ]]; then
    CACHE=/var/cache/rollout
else
    CACHE="${XDG_CACHE_HOME:-$HOME/.cache}/rollout"
fi
SITE="${ROLLOUT_AGENT_SITE:-$CACHE/agent-frameworks-$TAG}"
PY="${SANDBOX_PYTHON:-/usr/bin/python3}"
MARKER="$SITE/.rollout-complete"

say() { printf '[agent-frameworks-env] %s\n' "$*" >&2; }

if [[ -f "$MARKER" && "$(cat "$MARKER")" == "$PINS" ]]; then
    say "reusing $SITE ($PINS)"
    echo "$SITE"
    exit 0
fi
if [[ ! -x "$PY" ]]; then
    say "$PY is missing: sandboxes run it; install python3 (apt-get install python3)"
    exit 1
fi
if ! "$PY" -m pip --version >/dev/null 2>&1; then
    say "installing pip for $PY (Debian's python3-pip)"
    if [[ "$(id -u)" = 0 ]] && command -v apt-get >/dev/null 2>&1; then
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-pip >/dev/null 2>&1 || {
            apt-get update -qq >/dev/null 2>&1 || true
            DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-pip >/dev/null 2>&1
        }
    fi
    "$PY" -m pip --version >/dev/null 2>&1 || { say "no pip for $PY: install python3-pip"; exit 1; }
fi
say "installing $PINS into $SITE"
rm -rf "$SITE"
mkdir -p -m 755 "$SITE"
# --target keeps everything in one directory; PIP_ROOT_USER_ACTION quiets the root warning.
PIP_ROOT_USER_ACTION=ignore "$PY" -m pip install --quiet --disable-pip-version-check \
    --no-warn-script-location --target "$SITE" $PINS >&2
# Readable by the sandboxes' own users (a worker running as root gives each sandbox one).
chmod -R a+rX "$SITE"
printf '%s' "$PINS" > "$MARKER"
say "ready"
echo "$SITE"
