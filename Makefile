# tensord: `make serve` and `make test` set everything up from a fresh clone.
#
# The CPU set (onnxruntime) and the GPU set (onnxruntime-gpu) both provide the
# `onnxruntime` module and must never share an environment: each setup target
# removes the other's package first.

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip --disable-pip-version-check -q
PIP_PROGRESS := $(PY) -m pip --disable-pip-version-check
DEMO_REPO ?= build/demo-models
ARGS ?=
SOAK_ARGS ?=
FUZZ_SECONDS ?= 600

.PHONY: setup setup-gpu proto dist docs demo serve genai-venv test test-frontends test-packages bench bench-soak bench-fuzz bench-gpu gpu-wheels gpu-ort-pack gpu-models lint npm-deps systemd-tools clean help

help:
	@echo "make serve      set up (venv, deps, demo models) and run the daemon on the demo repository"
	@echo "make test       set up and run the tests"
	@echo "make setup      virtualenv with what serving on the CPU needs (onnxruntime)"
	@echo "make setup-gpu  virtualenv with what serving on a GPU needs (onnxruntime-gpu, CUDA bindings)"
	@echo "make docs       regenerate docs/configuration.md from the settings"
	@echo "make test-frontends  the gRPC tests against two frontend processes"
	@echo "make genai-venv the pinned onnxruntime-genai venv (build/genai-venv) and the tests' model builder folders"
	@echo "make proto      regenerate the Python stubs from protos/ (tensord.v1, and KServe v2)"
	@echo "make dist       wheels and sdists of tensord-client and tensord in dist/"
	@echo "make bench      run the Predict (batching off, then on), frontend processes and Generate benchmarks (demo model, then a Llama as a model-builder folder and as an Optimum export, against onnxruntime-genai), structured output, embeddings and the soak run (writes benchmarks/results/)"
	@echo "make bench-soak run the soak run alone (SOAK_ARGS=\"--minutes 30\")"
	@echo "make bench-fuzz fuzz the daemon for FUZZ_SECONDS (600; make test fuzzes 30 s)"
	@echo "make bench-gpu  run the kernel and CUDA executor benchmarks (need a GPU)"
	@echo "make gpu-wheels the wheels tests/gpu/run-offline.sh installs on an offline GPU host"
	@echo "make gpu-ort-pack   onnxruntime-gpu cut to its CUDA provider, in checksummed parts for an offline GPU host"
	@echo "make gpu-models the fp16 CUDA builder folder (and transformers' reference) GPU call 3 carries"
	@echo "make lint       ruff (check, format), mypy, the layers contract (lint-imports) and the size limits (tools/check_sizes.py)"

$(PY):
	$(PYTHON) -m venv $(VENV)

# What serving needs, with pip's progress shown; the dev tools come with `make test`.
$(VENV)/.setup-cpu: pyproject.toml clients/python/pyproject.toml | $(PY)
	@echo "tensord: installing what serving on the CPU needs into $(VENV) (ONNX Runtime, gRPC, NumPy, ...)"
	$(PY) -m pip uninstall -y -q onnxruntime-gpu 2>/dev/null || true
	$(PIP_PROGRESS) install --progress-bar on -e clients/python -e ".[cpu]"
	rm -f $(VENV)/.setup-gpu
	touch $@

$(VENV)/.setup-gpu: pyproject.toml clients/python/pyproject.toml | $(PY)
	@echo "tensord: installing what serving on a GPU needs into $(VENV) (onnxruntime-gpu, CUDA bindings, NVRTC, ...)"
	$(PY) -m pip uninstall -y -q onnxruntime 2>/dev/null || true
	$(PIP_PROGRESS) install --progress-bar on -e clients/python -e ".[gpu]"
	rm -f $(VENV)/.setup-cpu
	touch $@

# Keep whichever set is installed; a fresh environment gets the CPU set.
SETUP_STAMP := $(if $(wildcard $(VENV)/.setup-gpu),$(VENV)/.setup-gpu,$(VENV)/.setup-cpu)

# Triton's Python client, which the Open Inference Protocol tests drive. Its grpc extra
# asks for protobuf < 7, older than tensord's stubs need; its generated modules load under
# protobuf 7, so it comes without its pins, plus the one module of its own it imports
# that nothing else brings (rapidjson; numpy, grpcio, ml_dtypes and packaging come with dev).
TRITONCLIENT := "tritonclient==2.73.0" "python-rapidjson>=1.20,<2"

# The test and lint tools (pytest, ruff, mypy, grpcio-tools, NVRTC for the kernel tests).
$(VENV)/.setup-dev: pyproject.toml $(SETUP_STAMP)
	$(PIP) install -e clients/python -e ".[dev]"
	$(PIP) install --no-deps $(TRITONCLIENT)
	touch $@

# The tests also export Hugging Face models (the export extra: torch CPU, transformers,
# optimum-onnx); serving does not need them.
$(VENV)/.setup-export: pyproject.toml $(SETUP_STAMP)
	$(PIP) install -e clients/python -e ".[export]"
	touch $@

setup: $(VENV)/.setup-cpu
setup-gpu: $(VENV)/.setup-gpu

docs: $(SETUP_STAMP)
	$(PY) tools/config_reference.py

proto: $(VENV)/.setup-dev
	$(PY) clients/python/generate_stubs.py
	$(PY) tools/kserve_stubs.py

# Wheels and sdists of both distributions: tensord-client (clients/python: the library, the
# generated stubs, tensorctl) and tensord, which depends on it. `build` makes each wheel
# from its sdist, so a file missing from an sdist fails here, not on a user's host.
dist: $(VENV)/.setup-dev
	rm -rf dist
	$(PY) -m build --no-isolation --outdir dist clients/python
	$(PY) -m build --no-isolation --outdir dist .

# `npm install` rather than `npm ci`: buf's lock file lists its per-platform binaries as
# optional packages, and npm 11 leaves the other platforms' entries out, which `npm ci`
# then rejects as out of sync. The lock still pins every version and checksum.
protos/node_modules/.installed: protos/package.json protos/package-lock.json
	npm install --prefix protos --no-audit --no-fund
	touch $@

clients/node/node_modules/.installed: clients/node/package.json clients/node/package-lock.json
	npm install --prefix clients/node --no-audit --no-fund
	touch $@

npm-deps: protos/node_modules/.installed clients/node/node_modules/.installed

# systemd-analyze, systemd-sysusers and systemd-tmpfiles check the files in systemd/
# (Debian's `systemd` package; the tests need no running systemd). Installed as root when
# missing; otherwise those tests skip, or fail under CI=true.
systemd-tools:
	@command -v systemd-analyze >/dev/null 2>&1 || { \
		if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
			apt-get update -qq && DEBIAN_FRONTEND=noninteractive \
				apt-get install -y -qq --no-install-recommends systemd; \
		else echo "systemd-analyze is missing: apt-get install systemd (as root)"; fi; }

$(DEMO_REPO)/.built: $(SETUP_STAMP) $(wildcard daemon/tensord/demo/*.py)
	$(VENV)/bin/tensord demo-repo --force $(DEMO_REPO)
	touch $@

demo: $(DEMO_REPO)/.built

serve: $(SETUP_STAMP) demo
	TENSORD_SAY_HOW_TO_CALL=1 $(VENV)/bin/tensord serve --model-repository $(DEMO_REPO) $(ARGS)

# Debian packages the metrics and load-balancer tests drive (promtool, nginx). We run as
# root; where apt-get cannot install them, those tests skip (and fail under CI=true).
APT_INSTALL := DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=300 install -y -q --no-install-recommends
test-packages:
	@missing=""; \
	command -v promtool >/dev/null || missing="$$missing prometheus"; \
	command -v nginx >/dev/null || [ -x /usr/sbin/nginx ] || missing="$$missing nginx"; \
	if [ -n "$$missing" ]; then \
		echo "installing$$missing"; \
		{ apt-get update -q && $(APT_INSTALL) $$missing; } || echo "could not install$$missing"; \
	fi

# The frontends tier: the same gRPC tests against `[server] frontends = 2` (a supervisor,
# an engine and two frontend processes); those marked in_process stay with the first run.
# `make test` runs it after the others unless ARGS names tests (tests/...).
FRONTENDS_TIER = tests/grpc/test_predict.py tests/grpc/test_health_info.py \
	tests/grpc/test_kserve.py tests/grpc/test_processing.py tests/grpc/test_bad_input.py \
	tests/grpc/test_generate.py tests/grpc/test_batching.py tests/grpc/test_random_requests.py \
	tests/grpc/test_reflection.py tests/grpc/test_auth.py tests/grpc/test_limits.py \
	tests/grpc/test_intake.py tests/grpc/test_client_api.py tests/grpc/test_readiness.py \
	tests/grpc/test_builder_folders.py tests/grpc/test_structured_output.py \
	tests/grpc/test_embeddings.py tests/grpc/test_model_control.py \
	tests/e2e/test_fuzz.py

# onnxruntime-genai's model builder needs transformers >= 5, which tensord's venv cannot
# have: a venv of its own, pinned by tests/genai_requirements.txt (made once, about 90 s;
# again when that file changes), and the tests' tiny builder folders made with it
# (build/genai-models/, about 15 s; reused while their inputs stand). Both print what they do.
genai-venv: $(SETUP_STAMP)
	$(PY) -m tests.genai_models

test: $(VENV)/.setup-dev $(VENV)/.setup-export npm-deps systemd-tools test-packages genai-venv
	$(PY) -m pytest $(ARGS)
ifeq ($(findstring tests/,$(ARGS)),)
	TENSORD_TEST_FRONTENDS=2 TENSORD_FUZZ_SECONDS=10 $(PY) -m pytest -p no:cacheprovider -m "not in_process" $(FRONTENDS_TIER)
endif

test-frontends: $(VENV)/.setup-dev
	TENSORD_TEST_FRONTENDS=2 TENSORD_FUZZ_SECONDS=10 $(PY) -m pytest -p no:cacheprovider -m "not in_process" $(FRONTENDS_TIER)

bench: $(VENV)/.setup-dev $(VENV)/.setup-export demo
	$(PY) benchmarks/predict_bench.py $(ARGS)
	$(PY) benchmarks/predict_bench.py --batching $(ARGS)
	$(PY) benchmarks/perf_analyzer_bench.py
	$(PY) benchmarks/frontends_bench.py $(FRONTENDS_ARGS)
	$(PY) benchmarks/generate_bench.py $(GENERATE_ARGS)
	$(PY) benchmarks/generate_hf_bench.py --model builder $(GENERATE_HF_ARGS)
	$(PY) benchmarks/generate_hf_bench.py --model optimum $(GENERATE_HF_ARGS)
	$(PY) benchmarks/structured_bench.py
	$(PY) benchmarks/embed_bench.py
	$(PY) benchmarks/soak.py $(SOAK_ARGS)
	TENSORD_FUZZ_SECONDS=$(FUZZ_SECONDS) $(PY) -m pytest -p no:cacheprovider tests/e2e/test_fuzz.py

# The fuzz tier alone, longer than make test's 30 s (FUZZ_SECONDS, TENSORD_FUZZ_SEED).
bench-fuzz: $(VENV)/.setup-dev
	TENSORD_FUZZ_SECONDS=$(FUZZ_SECONDS) $(PY) -m pytest -p no:cacheprovider tests/e2e/test_fuzz.py

bench-soak: $(SETUP_STAMP) demo
	$(PY) benchmarks/soak.py $(SOAK_ARGS)

# The kernel benchmark says so and exits 0 on a host without a GPU; gpu_bench.py stops there.
bench-gpu: $(SETUP_STAMP)
	$(PY) benchmarks/kernel_bench.py $(KERNEL_ARGS)
	$(PY) benchmarks/gpu_bench.py $(ARGS)

# The offline GPU run (docs/development.md): wheels for the GPU host's Python 3.12, which
# has no network; tests/gpu/run-offline.sh installs them with --no-index.
GPU_WHEELS ?= build/gpu-wheels
GPU_PIP_DOWNLOAD = $(PY) -m pip download --disable-pip-version-check --only-binary=:all: \
	--python-version 3.12 --implementation cp --abi cp312 --platform manylinux_2_28_x86_64 \
	--platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
	--platform manylinux2014_x86_64

# The ONNX Runtime release of pyproject.toml's cpu and gpu extras (a unit test keeps them equal):
# GPU call 1 carries its CPU wheel, call 2 the repacked onnxruntime-gpu.
ORT_VERSION := 1.31.1

ORT_CPU_WHEEL ?= build/ort-cpu-wheel

# Call 1 carries the tree with both folders in one transfer of at most 64 MiB: together they
# may take 56 MiB. The pinned CPU onnxruntime has a folder of its own, which call 2 (on
# onnxruntime-gpu) leaves behind; it comes without its requirements (numpy, protobuf,
# flatbuffers, sympy, packaging), which the GPU host has.
gpu-wheels: | $(PY)
	rm -rf $(GPU_WHEELS) $(ORT_CPU_WHEEL)
	$(GPU_PIP_DOWNLOAD) -d $(GPU_WHEELS) -r tests/gpu/offline-requirements.txt
	$(GPU_PIP_DOWNLOAD) --no-deps -d $(ORT_CPU_WHEEL) "onnxruntime==$(ORT_VERSION)"
	@for folder in $(GPU_WHEELS) $(ORT_CPU_WHEEL); do \
		bytes=$$(du -sb $$folder | cut -f1); \
		echo "$$folder: $$(ls $$folder | wc -l) wheels, $$((bytes / 1048576)) MiB ($$bytes bytes)"; \
	done; \
	bytes=$$(du -scb $(GPU_WHEELS) $(ORT_CPU_WHEEL) | tail -1 | cut -f1); \
	if [ $$bytes -gt 58720256 ]; then echo "over the 56 MiB call 1 may carry beside the tree"; exit 1; fi

# Call 2 carries onnxruntime-gpu repacked (tests/gpu/ort_gpu_pack.py): only what its CUDA
# provider loads, kernels for ORT_GPU_ARCHS alone (90: H100, H200; "all" keeps every one),
# as tar.xz in equal parts of at most ORT_PART_MAX_MIB, with SHA256SUMS;
# tests/gpu/ort-gpu-install.sh puts them together on the GPU host. It prints the sizes and
# how many calls carry the parts.
ORT_PARTS ?= build/ort-gpu-parts
ORT_GPU_ARCHS ?= 90
ORT_PART_MAX_MIB ?= 56
gpu-ort-pack: | $(PY)
	rm -rf $(ORT_PARTS) build/ort-gpu-wheel
	$(GPU_PIP_DOWNLOAD) --no-deps -d build/ort-gpu-wheel "onnxruntime-gpu==$(ORT_VERSION)"
	$(PY) -m tests.gpu.ort_gpu_pack build/ort-gpu-wheel/onnxruntime_gpu-*.whl $(ORT_PARTS) \
		--archs $(ORT_GPU_ARCHS) --part-max-mib $(ORT_PART_MAX_MIB) --gpu-wheels $(GPU_WHEELS)
	rm -rf build/ort-gpu-wheel

# GPU call 3 carries build/gpu-models: the Generate benchmark's Llama through the model
# builder as GPU users download it (-p fp16 -e cuda), with transformers' greedy reference
# (tests/gpu/builder_fp16.py, in the genai venv it makes on first use; reused while its
# inputs stand), and the Optimum export of the same weights, as exported and in float16.
# It prints the size (27 MiB: too much beside both onnxruntime-gpu parts).
gpu-models: $(SETUP_STAMP)
	$(PY) -m tests.gpu.builder_fp16

lint: $(VENV)/.setup-dev
	$(VENV)/bin/ruff check daemon clients/python tests benchmarks tools
	$(VENV)/bin/ruff format --check daemon clients/python tests benchmarks tools
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports --no-cache
	$(PY) tools/check_sizes.py

clean:
	rm -rf $(VENV) build protos/node_modules clients/node/node_modules
