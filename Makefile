# The two commands a fresh machine needs: `make serve` and `make test`.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

# The model repository (Triton's layout, NAME/VERSION/) and the one model version that the
# single-model targets (export, soak, overload) use.
MODELS ?= models
MODEL ?= models/de-en/1
ADDRESS ?= localhost:50051
METRICS_PORT ?= 9090

.PHONY: install serve export lint test test-slow test-container fuzz soak overload bench bench-quick bench-real-size perf-analyzer clean

$(STAMP): pyproject.toml setup.py $(wildcard protos/*/*.proto protos/*/*/*.proto)
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[export,test,lint]'
	touch $(STAMP)

install: $(STAMP)

# Whether a version dir's onnx/ holds an export this version serves by default: a manifest of the
# current graph format with the int8 graphs, fused decoder step included (an fp32-only export, as
# `mtserve verify` leaves, is exported again).
EXPORTED = $(PY) -c "import sys; from contract.manifest import load_manifest; load_manifest(sys.argv[1], verify_checksums=False, precision=\"int8\", graph=\"fused\")" 2>/dev/null

# Export every shipped checkpoint of the repository whose graphs are missing or of an older format,
# then serve them all (the first by name is the default model).
EXPORT_REPOSITORY = for v in $(MODELS)/*/[0-9]*; do $(EXPORTED) $$v/onnx || $(PY) -m mtserve export --model $$v --precision all || exit 1; done

serve: $(STAMP)
	$(EXPORT_REPOSITORY)
	$(PY) -m mtserve serve --model-repository $(MODELS) --address $(ADDRESS) --metrics-port $(METRICS_PORT)

export: $(STAMP)
	$(PY) -m mtserve export --model $(MODEL) --precision all

# Formatter, linter, types, the import contracts (pyproject.toml: [tool.ruff], [tool.mypy],
# [tool.importlinter]) and no import circle anywhere, imports inside functions and under
# TYPE_CHECKING included (scripts/import_cycles.py); .ci/run runs it before the tests.
lint: $(STAMP)
	$(PY) -m ruff format --check .
	$(PY) -m ruff check .
	$(PY) -m mypy
	$(VENV)/bin/lint-imports
	$(PY) scripts/import_cycles.py

test: $(STAMP)
	$(PY) -m pytest -q -m "not slow"

test-slow: $(STAMP)
	$(PY) -m pytest -q -m "slow and not container"

# Build the Dockerfile's cpu image with podman on a local debootstrap base, run it, translate,
# SIGTERM it (tests/deploy/test_container.py; root, about 5 minutes on 2 cores without a layer cache).
test-container: $(STAMP)
	$(PY) -m pytest -q -s -m container tests/deploy/test_container.py

# Reliability (docs/security.md): property-based tests at FUZZ_SCALE times the default number of
# cases, a soak of SOAK_MINUTES at concurrency 64 (random cancellations and deadlines), and a
# flood of 512 clients against a small queue, each against a real `mtserve serve` on loopback.
FUZZ_SCALE ?= 20
SOAK_MINUTES ?= 10

fuzz: $(STAMP)
	MTSERVE_FUZZ_SCALE=$(FUZZ_SCALE) $(PY) -m pytest -q -p no:cacheprovider tests/service/grpc/test_fuzz.py

soak: $(STAMP)
	$(EXPORTED) $(MODEL)/onnx || $(PY) -m mtserve export --model $(MODEL) --precision all
	$(PY) -m benchmarks.soak --model-dir $(MODEL) --minutes $(SOAK_MINUTES) --concurrency 64

overload: $(STAMP)
	$(EXPORTED) $(MODEL)/onnx || $(PY) -m mtserve export --model $(MODEL) --precision all
	$(PY) -m benchmarks.soak --model-dir $(MODEL) --scenario overload --clients 512 --rounds 3

# Benchmarks side by side (python -m benchmarks.run, docs/benchmarks.md): offline engines (PyTorch with and
# without a cache, ONNX Runtime, CTranslate2), the server under load, a thread-layout sweep.
# bench-quick is the short mode (~3 minutes, and a few more for the real-size part: an OPUS-MT-sized model,
# built once into benchmarks/.cache/; BENCH_ARGS=--no-real-size skips it); both end with one JSON line of
# headline ratios. bench-real-size runs the real-size part alone (benchmarks/real_size.py) and its profile.
BENCH_ARGS ?=

BENCH_DEPS = $(PY) -c "import ctranslate2, matplotlib" 2>/dev/null && test -x $(VENV)/bin/py-spy \
	|| $(PY) -m pip install -q -e '.[bench]'

bench: $(STAMP)
	$(BENCH_DEPS)
	$(EXPORT_REPOSITORY)
	$(PY) -m benchmarks.run --profile $(BENCH_ARGS)

bench-quick: $(STAMP)
	$(BENCH_DEPS)
	$(EXPORT_REPOSITORY)
	$(PY) -m benchmarks.run --quick $(BENCH_ARGS)

bench-real-size: $(STAMP)
	$(BENCH_DEPS)
	$(PY) -m benchmarks.real_size --quick
	$(PY) -m benchmarks.real_size_profile

# Triton's perf_analyzer, unchanged, against the KServe endpoint of `mtserve serve` (default settings,
# a free loopback port) at concurrency 1, 2, 4, 8, then benchmarks/online.py on the same server and
# levels (scripts/perf_analyzer.sh bench; docs/perf_analyzer.md). The PyPI binary needs glibc >= 2.38,
# so it runs in a Debian trixie root built once with debootstrap in /var/tmp/mtserve-trixie (root;
# about a minute). CONCURRENCY=1,2 (or a range 1:8) and PA_OUT=DIR in the environment are honoured.
perf-analyzer: $(STAMP)
	$(EXPORTED) $(MODEL)/onnx || $(PY) -m mtserve export --model $(MODEL) --precision all
	PY=$(PY) scripts/perf_analyzer.sh bench $(MODEL)

clean:
	rm -rf $(VENV) build *.egg-info
