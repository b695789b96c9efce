#!/usr/bin/env bash
# The README's first command: install what is missing, build, and run `rollout up` on the
# bundled examples — 64 synthetic jobs in 8 prompt groups and 16 `shell` jobs, each in a
# bubblewrap sandbox of its own — with progress and a summary.
# Uses SQLite under ./.rollout and a NATS server on 127.0.0.1:4222 (started as a child
# process if none answers there). Extra arguments go to `rollout up`.
set -euo pipefail
cd "$(dirname "$0")/.."
eval "$(scripts/setup.sh)"
cargo build --release --bins
exec target/release/rollout up --submit examples/synthetic.jsonl --submit examples/shell.jsonl \
  --exit-when-done "$@"
