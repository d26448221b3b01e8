# The two commands a fresh machine needs: `make serve` and `make test`.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: install test test-slow clean

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[export,test]'
	touch $(STAMP)

install: $(STAMP)

test: $(STAMP)
	$(PY) -m pytest -q -m "not slow"

test-slow: $(STAMP)
	$(PY) -m pytest -q -m slow

clean:
	rm -rf $(VENV) build *.egg-info
