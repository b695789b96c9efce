#!/usr/bin/env bash
# Makes (or reuses) o200k_base.tiktoken, the vocabulary gpt-oss's harmony format is
# tokenized with, so that the tests can run openai-harmony (and vLLM's harmony parser
# on top of it) offline: openai-harmony otherwise downloads the file from the web at
# first use. The file is rebuilt from the `tiktoken` npm package, which ships the same
# ranks in a layout of its own (`encoders/o200k_base.json`), and checked against the
# file's published SHA-256, which openai-harmony checks too; its split pattern is kept
# beside it (o200k_base.pattern). Prints progress on stderr and the directory holding
# the files (for TIKTOKEN_ENCODINGS_BASE) on stdout.
#
# Environment:
#   ROLLOUT_O200K_DIR   where the file goes
#                       (default ${XDG_CACHE_HOME:-$HOME/.cache}/rollout/o200k)
set -euo pipefail

NPM_VERSION=1.0.22
SHA256=446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d
DIR="${ROLLOUT_O200K_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/rollout/o200k}"
FILE="$DIR/o200k_base.tiktoken"

say() { printf '[o200k-env] %s\n' "$*" >&2; }

if [[ -f "$FILE" && -s "$DIR/o200k_base.pattern" ]] && echo "$SHA256  $FILE" | sha256sum --check --status; then
    echo "$DIR"
    exit 0
fi
if ! command -v npm >/dev/null; then
    say "npm is needed to fetch the tiktoken package the vocabulary is rebuilt from; install Node.js and npm (Debian: apt-get install npm)"
    exit 1
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
say "fetching tiktoken@$NPM_VERSION from the npm registry"
(cd "$tmp" && npm pack --silent "tiktoken@$NPM_VERSION" >/dev/null)
tar -xzf "$tmp/tiktoken-$NPM_VERSION.tgz" -C "$tmp" package/encoders/o200k_base.json
mkdir -p "$DIR"
# Each line of `bpe_ranks` is a label, the rank of its first token and the tokens
# (base64) of consecutive ranks; the .tiktoken file is one `token rank` line per rank.
# The split pattern goes beside it (o200k_base.pattern), for a tokenizer built from it.
python3 - "$tmp/package/encoders/o200k_base.json" "$FILE.part" "$DIR/o200k_base.pattern" <<'PY'
import json
import sys

encoder = json.load(open(sys.argv[1]))
with open(sys.argv[3], "w") as out:
    out.write(encoder["pat_str"])
ranks = {}
for line in encoder["bpe_ranks"].split("\n"):
    if not line:
        continue
    _, first, *tokens = line.split(" ")
    for i, token in enumerate(tokens):
        ranks[int(first) + i] = token
with open(sys.argv[2], "w") as out:
    out.writelines(f"{ranks[r]} {r}\n" for r in sorted(ranks))
PY
if ! echo "$SHA256  $FILE.part" | sha256sum --check --status; then
    say "the rebuilt o200k_base.tiktoken does not have the published SHA-256 $SHA256"
    rm -f "$FILE.part"
    exit 1
fi
mv "$FILE.part" "$FILE"
say "o200k_base.tiktoken ready in $DIR"
echo "$DIR"
