#!/usr/bin/env bash
# The model directory Infinity's ONNX Runtime engine (--engine optimum) serves: a copy of the
# default encoder's sentence-transformers directory with model.onnx beside its files, exported
# by optimum from the same weights (transformers' graph: last_hidden_state, which Infinity pools;
# the sentence-transformers export lacks it). Builds a model: run it under the machine lock.
#   benchmarks/peers/export_infinity_onnx.sh OUT_DIR
# then: python -m benchmarks.peers_embed --configs faithful --ringserve-faithful-args "" \
#   --infinity-faithful-args "--engine optimum --pooling-method mean" --infinity-model OUT_DIR
set -euo pipefail
out="${1:?usage: export_infinity_onnx.sh OUT_DIR}"
venv="${INFINITY_VENV:-.venv-infinity}"
encoder="$(.venv/bin/python -c 'from ringserve.factory.build import default_encoder_dir as d; print(d())')"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
mkdir -p "$out"
cp -r "$encoder/." "$out/"
HF_HUB_OFFLINE=1 DO_NOT_TRACK=1 "$venv/bin/optimum-cli" export onnx --model "$out" \
    --task feature-extraction --library-name transformers "$work/onnx"
mv "$work/onnx/model.onnx" "$out/model.onnx"
echo "$out/model.onnx"
