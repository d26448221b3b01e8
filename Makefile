# The two commands a fresh machine needs: `make serve` and `make test`.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

MODEL ?= models/de-en
ADDRESS ?= localhost:50051
METRICS_PORT ?= 9090

.PHONY: install serve export test test-slow clean

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[export,test]'
	touch $(STAMP)

install: $(STAMP)

# Export the shipped checkpoint to ONNX when its graphs are missing, then serve it.
serve: $(STAMP)
	test -f $(MODEL)/onnx/manifest.json || $(PY) -m service.cli export --model $(MODEL) --precision all
	$(PY) -m service.cli serve --model-dir $(MODEL) --address $(ADDRESS) --metrics-port $(METRICS_PORT)

export: $(STAMP)
	$(PY) -m service.cli export --model $(MODEL) --precision all

test: $(STAMP)
	$(PY) -m pytest -q -m "not slow"

test-slow: $(STAMP)
	$(PY) -m pytest -q -m slow

clean:
	rm -rf $(VENV) build *.egg-info
