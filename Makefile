# The two commands: `make run` (a local 3-node cluster with a demo) and `make test`.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# `make run` ports: node i serves clients on PORT+i, Raft on RAFT_PORT+i (default PORT+100+i)
# and, when METRICS_PORT is given, metrics on METRICS_PORT+i (e.g. make run PORT=7000).
PORT ?= 7100
RAFT_PORT ?=
METRICS_PORT ?=

.PHONY: run test bench protos clean

run: $(VENV)/.installed
	$(PY) -m gesmas.server.demo --base-port $(PORT) $(if $(RAFT_PORT),--raft-port $(RAFT_PORT)) \
		$(if $(METRICS_PORT),--metrics-port $(METRICS_PORT))

test: $(VENV)/.installed
	@# the status page is tested in a real headless browser (Debian's chromium)
	@command -v chromium >/dev/null || (apt-get update -qq && apt-get install -y -qq chromium) \
		|| echo "make test: could not install chromium; tests/test_status_page.py will fail"
	$(PY) protos/generate.py --check
	$(PY) -m pytest -q -p no:cacheprovider
	# the fault and membership suites again, with TLS and auth on (tests/rawgrpc.py)
	GESMAS_TEST_SECURE=1 $(PY) -m pytest -q -p no:cacheprovider tests/test_faults.py tests/test_rejoin.py tests/test_membership.py

bench: $(VENV)/.installed
	$(PY) bench/kernel_bench.py

protos: $(VENV)/.installed
	$(PY) protos/generate.py

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install -q --upgrade pip
	$(VENV)/bin/pip install -q -e '.[dev,bench,tooz-test]'
	touch $@

clean:
	rm -rf $(VENV) build *.egg-info
