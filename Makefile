# The two commands: `make run` (a local 3-node cluster with a demo) and `make test`.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python

.PHONY: run test bench protos clean

run: $(VENV)/.installed
	$(PY) -m gesmas.server.demo

test: $(VENV)/.installed
	$(PY) protos/generate.py --check
	$(PY) -m pytest -q -p no:cacheprovider
	# the fault and membership suites again, with TLS and auth on (tests/rawgrpc.py)
	GESMAS_TEST_SECURE=1 $(PY) -m pytest -q -p no:cacheprovider tests/test_faults.py tests/test_membership.py

bench: $(VENV)/.installed
	$(PY) bench/kernel_bench.py

protos: $(VENV)/.installed
	$(PY) protos/generate.py

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install -q --upgrade pip
	$(VENV)/bin/pip install -q -e '.[dev,bench]'
	touch $@

clean:
	rm -rf $(VENV) build *.egg-info
