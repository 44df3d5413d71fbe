# Entry points. Every target bootstraps .venv itself; nothing is installed by hand.
#   make demo   train → export → verify every built-in model, print the parity tables
#   make test   the test suite (what CI runs, with make lint)

SHELL := /bin/bash
.DEFAULT_GOAL := help

PYTHON ?= python3.11
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
MODEL ?= digits_lenet
# The built-in models `make demo` runs end to end: all of them (`pipeline models`).
DEMO_MODELS ?= digits_lenet digits_mlp my_decision_gate my_cell my_rnn_loop wrap_rnn lstm_tagger gru_encoder
ARTIFACTS ?= artifacts
PIPELINE := $(BIN)/pipeline --artifacts-dir $(ARTIFACTS)
CHECKPOINT := $(ARTIFACTS)/$(MODEL)/checkpoint.pt
MANIFEST := $(ARTIFACTS)/$(MODEL)/export/manifest.json
PYTEST_ARGS ?=

# torch/torchvision first, with pip, exactly as ../shared/DESIGN.md says: pip
# takes these builds from this machine's disk (uv/poetry would download GBs).
$(STAMP): pyproject.toml
	@command -v $(PYTHON) >/dev/null || { echo "error: $(PYTHON) not found; install Python 3.11 or run make PYTHON=/path/to/python3.11" >&2; exit 1; }
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet torch==2.14.1 torchvision==0.29.1
	$(BIN)/python -m pip install --quiet -e '.[dev,ray,docs,pte]'
	touch $@

STORE ?= model_store
RUN_DIR ?= $(ARTIFACTS)/serve
# Models `make archive` packs (every format each export holds); `make serve` then
# serves one format of each (bench's fastest, else TorchScript), cores / models workers each (at least 1).
SERVE_MODELS ?= $(DEMO_MODELS)
# A model name finds the format the server serves it in.
INFER_MODEL ?= $(MODEL)
INFER_INPUT ?= $(ARTIFACTS)/$(MODEL)/export/golden.pt
# e.g. make archive ARCHIVE_FLAGS="--device gpu" && make serve SERVE_FLAGS=--gpu
ARCHIVE_FLAGS ?=
SERVE_FLAGS ?=

CPP_BUILD ?= cpp_client/build

# JIT=refused rehearses PyTorch's refusal of torch.jit (PR #189705) in every process a
# target starts, e.g. `make demo JIT=refused` (docs/export.md, "TorchScript's sunset").
ifeq ($(JIT),refused)
export PYTHONPATH := $(CURDIR)/tests/jit_refused$(if $(PYTHONPATH),:$(PYTHONPATH))
endif

.PHONY: help venv train train-ddp export verify verify-example demo test test-unit test-fast test-times test-cpu docs lint format clean archive serve stop infer cpp latency loadtest bench bench-export
help:  ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-11s %s\n", $$1, $$2}'

venv: $(STAMP)  ## create .venv with the pinned dependencies

$(CHECKPOINT): | $(STAMP)
	$(PIPELINE) train --model $(MODEL)

# e.g. make export EXPORT_FLAGS="--format all" (TorchScript, ONNX and .pt2)
EXPORT_FLAGS ?=
$(MANIFEST): $(CHECKPOINT)
	$(PIPELINE) export --model $(MODEL) $(EXPORT_FLAGS)

train: | $(STAMP)  ## train MODEL (default digits_lenet) and write its checkpoint
	$(PIPELINE) train --model $(MODEL)

NPROC ?= 2
train-ddp: | $(STAMP)  ## train MODEL with DistributedDataParallel over NPROC processes (torchrun)
	$(BIN)/torchrun --standalone --nproc-per-node $(NPROC) -m pipeline --artifacts-dir $(ARTIFACTS) train --model $(MODEL)

export: $(MANIFEST)  ## export MODEL's checkpoint to TorchScript + ONNX (EXPORT_FLAGS="--format all" adds .pt2)

verify: $(MANIFEST)  ## compare every format the export holds with eager; fails on any mismatch
	$(PIPELINE) verify --model $(MODEL)

verify-example: | $(STAMP)  ## regenerate docs/verify-example/: a real failing parity report (altered ONNX weights)
	$(BIN)/python docs/verify-example/make_example.py

demo: | $(STAMP)  ## train, export and verify every built-in model (eager vs TorchScript, ONNX Runtime, .pt2, .pte, C++)
	$(BIN)/pipeline build-cpp --build-dir $(CPP_BUILD)
	@set -e; for m in $(DEMO_MODELS); do \
		echo "==> $$m"; \
		$(PIPELINE) train --model $$m --no-progress; \
		$(PIPELINE) export --model $$m --format all || test $$? -eq 3; \
		$(PIPELINE) verify --model $$m --with-cpp --cpp-build-dir $(CPP_BUILD); \
	done

cpp: | $(STAMP)  ## build the LibTorch C++ client (cpp_client/build/run_torchscript)
	$(BIN)/pipeline build-cpp --build-dir $(CPP_BUILD)

latency: | $(STAMP)  ## C++ client vs Python TorchScript at batch 1 (digits CNN, resnet18), one run
	$(BIN)/pipeline build-cpp --build-dir $(CPP_BUILD)
	test -f $(ARTIFACTS)/digits_lenet/export/manifest.json || { $(PIPELINE) train --model digits_lenet --no-progress && $(PIPELINE) export --model digits_lenet; }
	$(PIPELINE) export --model torchvision:resnet18 --random-init --if-missing
	$(PIPELINE) latency --model digits_lenet --model torchvision:resnet18

BENCH_FLAGS ?=
# The bench measures every format: an export missing one is redone with --format all.
BENCH_MODELS := torchvision:resnet18 digits_lenet my_decision_gate my_cell my_rnn_loop wrap_rnn lstm_tagger gru_encoder
# Also exported in the int8/float16 formats, for bench's precision table (the recurrent
# family has nothing to quantise, or torch.export refuses it: see docs/export.md).
BENCH_PRECISION_MODELS := torchvision:resnet18 digits_lenet

# Exports run two at a time (resnet18, the longest, first) and the C++ client
# builds beside them: each export is mostly one busy thread (the Python exporter,
# then one compiler process), so one after the other left a core idle.
bench: | $(STAMP)  ## every backend side by side: artifacts/bench/{bench.json,bench.md,*.png} (exports what is missing)
	@set -e; mkdir -p $(ARTIFACTS); \
	$(BIN)/pipeline build-cpp --build-dir $(CPP_BUILD) > $(ARTIFACTS)/bench-cpp-build.log 2>&1 & cpp=$$!; \
	trap 'kill $$cpp 2>/dev/null || true' EXIT; \
	printf '%s\n' $(BENCH_MODELS) | xargs -P 2 -I{} $(MAKE) --no-print-directory bench-export BENCH_MODEL={}; \
	wait $$cpp || { cat $(ARTIFACTS)/bench-cpp-build.log; echo "error: the C++ client did not build (log above)"; exit 1; }
	$(BIN)/python -m pip install --quiet -e '.[bench]'
	$(PIPELINE) bench $(BENCH_FLAGS)

# One model for make bench: trained (or, for torchvision, random weights) and
# exported in every registered format, unless its export already holds them all.
# Paths come from the pipeline (`pipeline where`), formats from its registry.
bench-export: | $(STAMP)  ## one model for make bench (BENCH_MODEL=NAME): trained, exported in every format
	@set -e; ckpt=$$($(PIPELINE) where --model $(BENCH_MODEL) --what checkpoint); \
	init=; case "$(BENCH_MODEL)" in \
		torchvision:*) test -f $$ckpt || init=--random-init ;; \
		*) test -f $$ckpt || $(PIPELINE) train --model $(BENCH_MODEL) --no-progress ;; \
	esac; \
	precision=; case " $(BENCH_PRECISION_MODELS) " in *" $(BENCH_MODEL) "*) precision="--format precision" ;; esac; \
	$(PIPELINE) export --model $(BENCH_MODEL) --format all $$precision --if-missing $$init \
		|| test $$? -eq 3  # partial (an int8 format outside its budget): bench shows it

LOADTEST_REQUESTS ?= 20000
LOADTEST_RESNET_REQUESTS ?= 1000
loadtest: | $(STAMP)  ## load runs on private servers: digits CNN (SIGKILL mid-run) and resnet18, answers checked
	test -f $(ARTIFACTS)/digits_lenet/export/manifest.json || { $(PIPELINE) train --model digits_lenet --no-progress && $(PIPELINE) export --model digits_lenet; }
	$(PIPELINE) export --model torchvision:resnet18 --random-init --if-missing
	$(PIPELINE) loadtest --serve --model digits_lenet --requests $(LOADTEST_REQUESTS) --concurrency 32 \
		--kill-worker-after $$(( $(LOADTEST_REQUESTS) / 2 )) --json $(ARTIFACTS)/loadtest/digits_lenet.json
	$(PIPELINE) loadtest --serve --model torchvision:resnet18 --requests $(LOADTEST_RESNET_REQUESTS) --concurrency 32 \
		--json $(ARTIFACTS)/loadtest/torchvision_resnet18.json

archive: | $(STAMP)  ## export (if needed) and archive SERVE_MODELS into model_store/ (.mar)
	@set -e; for m in $(SERVE_MODELS); do \
		test -f $(ARTIFACTS)/$$m/export/manifest.json || { \
			test -f $(ARTIFACTS)/$$m/checkpoint.pt || $(PIPELINE) train --model $$m --no-progress; \
			$(PIPELINE) export --model $$m; }; \
		$(PIPELINE) archive --model $$m --store $(STORE) $(ARCHIVE_FLAGS); \
	done

serve: | $(STAMP)  ## start TorchServe on 127.0.0.1 over model_store/, one format per model (token auth on)
	$(PIPELINE) serve --store $(STORE) --run-dir $(RUN_DIR) $(SERVE_FLAGS)

stop: | $(STAMP)  ## stop the TorchServe started by make serve
	$(PIPELINE) stop --run-dir $(RUN_DIR)

infer: | $(STAMP)  ## send INFER_INPUT (default: MODEL's golden batch) to INFER_MODEL
	$(PIPELINE) infer --run-dir $(RUN_DIR) --model $(INFER_MODEL) $(INFER_INPUT)

# Test files are shared out whole among pytest-xdist workers (a file's servers and
# module fixtures stay in one process), longest first (tests/conftest.py's LONGEST_FILES),
# one worker more than the cores, at most 4, since tests wait on servers and
# subprocesses much of their time. `make test TEST_WORKERS=0` runs in
# one process.
TEST_WORKERS ?= $(shell n=$$(nproc 2>/dev/null || echo 1); echo $$(( n + 1 < 4 ? n + 1 : 4 )))
# Every run ends with pytest's slowest setups and calls, then the worker time per module
# and the slowest fixtures (tests/timing.py; `make test-times` prints the last run's again).
TEST_DURATIONS ?= 25
test: | $(STAMP)  ## run the test suite (CI runs this)
	$(BIN)/python -m pytest -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder \
		--durations $(TEST_DURATIONS) $(PYTEST_ARGS)

test-unit: | $(STAMP)  ## only the unit tests (in-process, under a minute)
	$(BIN)/python -m pytest tests/unit $(PYTEST_ARGS)

# The inner loop: the unit tests and the runtime contract (every runtime serving for real).
test-fast: | $(STAMP)  ## unit tests + the runtime contract test, in parallel (under 2 minutes)
	$(BIN)/python -m pytest -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder tests/unit \
		tests/integration/test_runtime_contract.py $(PYTEST_ARGS)

test-times: | $(STAMP)  ## worker time per test module and the slowest fixtures, of the last run
	$(BIN)/python -m tests.timing

test-cpu: | $(STAMP)  ## the whole suite, then its CPU by kind of process (servers, compilers, commands)
	$(MAKE) test PYTEST_ARGS="$(PYTEST_ARGS) --cpu-profile"

docs: | $(STAMP)  ## build the docs site into site/ (MkDocs, strict: a broken link or an unlisted page fails)
	$(BIN)/mkdocs build --strict --site-dir site

lint: | $(STAMP)  ## ruff lint and format check
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

format: | $(STAMP)  ## apply ruff's fixes and formatting
	$(BIN)/ruff check --fix .
	$(BIN)/ruff format .

clean:  ## remove generated artifacts and archives (keeps .venv); stops a running server first
	-test -x $(BIN)/pipeline && $(PIPELINE) stop --run-dir $(RUN_DIR)
	rm -rf $(ARTIFACTS) build site .pytest_cache .ruff_cache
	rm -f $(STORE)/*.mar
	rm -rf $(CPP_BUILD)
