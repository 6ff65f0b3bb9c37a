#!/usr/bin/env bash
# Installs one peer of benchmarks/peers.py into a venv of its own (each peer's pins are not the
# project's): `install_peer.sh NAME [VENV]`, NAME one of infinity, litserve, pytriton, its
# requirements in benchmarks/peers/NAME.txt, VENV by default .venv-NAME. First a dry run: the
# plan must hold torch's CPU build and no CUDA package (nvidia-*, cuda*, the triton compiler that
# CUDA torch brings; nvidia-pytriton is the peer itself, a Triton server build whose CPU backends
# need no CUDA, and tritonclient its pure-Python client), else nothing is installed. Then the install, and a check that the
# torch it got has no CUDA.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
name="${1:?usage: install_peer.sh NAME [VENV]}"
requirements="$here/$name.txt"
[ -f "$requirements" ] || { echo "no $requirements" >&2; exit 2; }
python="${PYTHON:-$(command -v python3.11 || command -v python3)}"
venv="${2:-.venv-$name}"
report="$(mktemp)"
trap 'rm -f "$report"' EXIT

[ -x "$venv/bin/python" ] || "$python" -m venv "$venv"
"$venv/bin/python" -m pip install -q --upgrade pip
"$venv/bin/python" -m pip install -q --dry-run --report "$report" \
    -c "$here/constraints.txt" -r "$requirements"
"$venv/bin/python" - "$report" <<'PY'
import json
import sys

plan = {p["metadata"]["name"].lower(): p["metadata"]["version"]
        for p in json.load(open(sys.argv[1]))["install"]}
peer = {"nvidia-pytriton"}  # the peer itself, not a CUDA library
cuda = sorted(n for n in plan if (n.startswith(("nvidia-", "cuda")) or n in ("triton", "pytorch-triton"))
              and n not in peer)
torch = plan.get("torch", "")
if cuda or (torch and not torch.endswith("+cpu")):
    sys.exit(f"refused: the plan is not CPU-only (torch {torch!r}, {cuda})")
print(f"plan: {len(plan)} packages, torch {torch or 'already installed'}, no CUDA package")
PY
"$venv/bin/python" -m pip install -q -c "$here/constraints.txt" -r "$requirements"
"$venv/bin/python" -c "
import importlib.metadata as md, torch
assert torch.version.cuda is None, torch.version.cuda
wanted = [line.split('==')[0].split('[')[0] for line in open('$requirements')
          if line.strip() and not line.startswith('#')]
print(', '.join(f'{n} {md.version(n)}' for n in wanted), '| torch', torch.__version__)"
touch "$venv/.installed"
