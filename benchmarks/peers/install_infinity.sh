#!/usr/bin/env bash
# Installs Infinity into its own venv (default .venv-infinity), for benchmarks/peers_embed.py.
# First a dry run: the plan must hold torch's CPU build and no CUDA package (nvidia-*, triton),
# else nothing is installed. Then the install, and a check that the torch it got has no CUDA.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
python="${PYTHON:-$(command -v python3.11 || command -v python3)}"
venv="${1:-.venv-infinity}"
report="$(mktemp)"
trap 'rm -f "$report"' EXIT

[ -x "$venv/bin/python" ] || "$python" -m venv "$venv"
"$venv/bin/python" -m pip install -q --upgrade pip
"$venv/bin/python" -m pip install -q --dry-run --report "$report" \
    -c "$here/constraints.txt" -r "$here/infinity.txt"
"$venv/bin/python" - "$report" <<'PY'
import json
import sys

plan = {p["metadata"]["name"].lower(): p["metadata"]["version"]
        for p in json.load(open(sys.argv[1]))["install"]}
cuda = sorted(n for n in plan if n.startswith(("nvidia-", "triton", "cuda")))
torch = plan.get("torch", "")
if cuda or (torch and not torch.endswith("+cpu")):
    sys.exit(f"refused: the plan is not CPU-only (torch {torch!r}, {cuda})")
print(f"plan: {len(plan)} packages, torch {torch or 'already installed'}, no CUDA package")
PY
"$venv/bin/python" -m pip install -q -c "$here/constraints.txt" -r "$here/infinity.txt"
"$venv/bin/python" -c "
import torch, infinity_emb
assert torch.version.cuda is None, torch.version.cuda
print('infinity-emb', infinity_emb.__version__, 'torch', torch.__version__)"
