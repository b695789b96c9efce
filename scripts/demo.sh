#!/usr/bin/env bash
# The README's first command: install what is missing, build, and run `rollout up` on the
# bundled examples — 64 synthetic jobs in 8 prompt groups, 16 `shell` jobs, 32 `agent`
# episodes scored by a check command, and agent episodes scored by the graders: 50 math
# problems, 20 code problems (2 samples each) and 5 SWE-style repositories (4 samples
# each), each sandboxed job in a bubblewrap sandbox of its own — with progress and a
# summary of rewards by kind and grader. The agent episodes run against two stand-in inference servers
# (rollout-scripted-llm, one speaking vLLM's format and one SGLang's) that play the script
# in examples/agent-policy.json: they are not models.
# Uses SQLite under ./.rollout and a NATS server on 127.0.0.1:4222 (started as a child
# process if none answers there). Builds into CARGO_TARGET_DIR when it is set (default:
# ./target). Extra arguments go to `rollout up`.
set -euo pipefail
# A relative CARGO_TARGET_DIR means the directory it was given in, not the repository.
if [ -n "${CARGO_TARGET_DIR:-}" ]; then
  case "$CARGO_TARGET_DIR" in
    /*) ;;
    *) CARGO_TARGET_DIR="$PWD/$CARGO_TARGET_DIR" ;;
  esac
  export CARGO_TARGET_DIR
fi
cd "$(dirname "$0")/.."
eval "$(scripts/setup.sh)"
cargo build --release --bins
bin="${CARGO_TARGET_DIR:-target}/release"
state=.rollout
mkdir -p "$state"

# The model directory both the stand-in servers and the RUN workers load.
"$bin/rollout-scripted-llm" write-model "$state/demo-model" --policy examples/agent-policy.json

pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
}
trap cleanup EXIT

# Two stand-in servers on free ports; each prints `listening on URL` first.
urls=()
for i in 0 1; do
  out="$state/scripted-$i.out"
  : >"$out"
  "$bin/rollout-scripted-llm" serve --listen 127.0.0.1:0 --model "$state/demo-model" \
    --policy examples/agent-policy.json --seed "$i" --token-us 200 \
    --enable-prompt-tokens-details --enable-deterministic-inference >"$out" 2>"$state/scripted-$i.log" &
  pids+=("$!")
  for _ in $(seq 100); do
    grep -q '^listening on ' "$out" && break
    sleep 0.1
  done
  url=$(sed -n 's/^listening on //p' "$out")
  [ -n "$url" ] || { echo "demo: the stand-in server did not start; see $state/scripted-$i.log" >&2; exit 1; }
  urls+=("$url")
done

config="$state/demo.toml"
cat >"$config" <<EOF
# Written by scripts/demo.sh: the two stand-in backends of the demo.
[[backends]]
id = "scripted-vllm"
url = "${urls[0]}"
kind = "vllm"
model = "scripted"
tokenizer = "$state/demo-model"

[[backends]]
id = "scripted-sglang"
url = "${urls[1]}"
kind = "sglang"
model = "scripted"
tokenizer = "$state/demo-model"
EOF

# The five tiny repositories the SWE examples clone (examples/swe.jsonl names them by
# paths relative to this directory).
python3 scripts/make-swe-examples.py --repos "$state/swe-repos" >/dev/null

"$bin/rollout" --config "$config" up --submit examples/synthetic.jsonl --submit examples/shell.jsonl \
  --submit examples/agent.jsonl --submit examples/math.jsonl --submit examples/code.jsonl \
  --submit examples/swe.jsonl --exit-when-done "$@"
