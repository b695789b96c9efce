#!/usr/bin/env bash
# Installs (or reuses) the trainer package the Python client's adapter tests import
# (clients/python/tests/test_adapters.py), pinned, into one directory, and prints that
# directory on the last line of stdout (progress goes to stderr). The tests put it on
# sys.path from ROLLOUT_TRAINER_SITE.
#
# Only SkyRL is installed: skyrl-train 0.3.1's generator interface
# (skyrl_train/generators/base.py) is plain Python, so the tests subclass the real
# class. The package itself is installed without its dependencies (torch, ray, vLLM:
# gigabytes, and GPU builds) and past its `Requires-Python: ==3.12.*` (the module runs
# on 3.9 and later); the tests import that one module past the package's __init__,
# which would import the rest. verl's and slime's agent-loop and Sample modules import
# torch (and verl's ray and vLLM's client) at the top, so their tests check the
# adapters' output against the fields of the pinned versions instead (the README's
# "Adapters" section).
#
# Cold: about 5 seconds and 3 MB. Warm (already complete): instant.
#
# Environment:
#   ROLLOUT_TRAINER_SITE  where the package goes (default: ${XDG_CACHE_HOME:-$HOME/.cache}/rollout/trainer-adapters-<pins>)
#   PYTHON                the interpreter whose pip installs it (default python3: the one the tests run)
set -euo pipefail

PINS="skyrl-train==0.3.1"
TAG="$(printf '%s' "$PINS" | sha256sum | cut -c1-12)"
SITE="${ROLLOUT_TRAINER_SITE:-${XDG_CACHE_HOME:-$HOME/.cache}/rollout/trainer-adapters-$TAG}"
PY="${PYTHON:-python3}"
MARKER="$SITE/.rollout-complete"

say() { printf '[trainer-adapters-env] %s\n' "$*" >&2; }

if [[ -f "$MARKER" && "$(cat "$MARKER")" == "$PINS" ]]; then
    say "reusing $SITE ($PINS)"
    echo "$SITE"
    exit 0
fi
say "installing $PINS into $SITE"
rm -rf "$SITE"
mkdir -p "$SITE"
PIP_ROOT_USER_ACTION=ignore "$PY" -m pip install --quiet --disable-pip-version-check \
    --no-deps --ignore-requires-python --target "$SITE" $PINS >&2
printf '%s' "$PINS" > "$MARKER"
say "ready"
echo "$SITE"
