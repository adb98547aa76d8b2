# The two commands: `make run` (a local 3-node cluster with a demo) and `make test`.
# `make run` installs gesmas and what it needs to run, nothing more; `make test` adds the
# test and benchmark tools on top (and, if missing, Debian's chromium for the status page).
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# INSTALL_CHROMIUM=no: never install chromium (tests/test_status_page.py then fails)
INSTALL_CHROMIUM ?= yes
# `make run` ports: node i serves clients on PORT+i, Raft on RAFT_PORT+i (default PORT+100+i)
# and, when METRICS_PORT is given, metrics on METRICS_PORT+i (e.g. make run PORT=7000).
PORT ?= 7100
RAFT_PORT ?=
METRICS_PORT ?=

.PHONY: run test chromium bench protos clean

run: $(VENV)/.runtime
	$(PY) -m gesmas.server.demo --base-port $(PORT) $(if $(RAFT_PORT),--raft-port $(RAFT_PORT)) \
		$(if $(METRICS_PORT),--metrics-port $(METRICS_PORT))

test: $(VENV)/.installed chromium
	$(PY) protos/generate.py --check
	$(PY) -m pytest -q -p no:cacheprovider --durations=15
	# fail-over and membership again with TLS and auth on (tests/rawgrpc.py)
	GESMAS_TEST_SECURE=1 $(PY) -m pytest -q -p no:cacheprovider tests/test_membership.py \
		tests/test_faults.py -k "not faults or kill_leader"

# tests/test_status_page.py renders the status page in a real headless browser
chromium:
	@command -v chromium >/dev/null || command -v chromium-browser >/dev/null || { \
	  echo "make: tests/test_status_page.py needs a headless browser and chromium is missing."; \
	  if [ "$(INSTALL_CHROMIUM)" = yes ]; then \
	    echo "make: installing Debian's chromium package with apt-get (a few hundred MB;"; \
	    echo "make: INSTALL_CHROMIUM=no skips this, and that one test then fails)"; \
	    { apt-get update -qq && apt-get install -y -qq chromium; } \
	      || echo "make: could not install chromium; tests/test_status_page.py will fail"; \
	  else \
	    echo "make: INSTALL_CHROMIUM=$(INSTALL_CHROMIUM): not installing it; that test will fail"; \
	  fi; }

bench: $(VENV)/.installed
	$(PY) bench/kernel_bench.py

protos: $(VENV)/.installed
	$(PY) protos/generate.py

# gesmas and its runtime dependencies (grpcio, pysyncobj, ...): enough for `make run`
$(VENV)/.runtime: pyproject.toml
	@echo "make: installing gesmas and its runtime dependencies into $(VENV)"
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install -q --upgrade pip
	$(VENV)/bin/pip install -q -e .
	touch $@

# ... plus the extras of pyproject.toml the tests use: dev (pytest, hypothesis, mypy,
# grpcio-tools), bench (kazoo, matplotlib: the benchmark smoke tests) and tooz-test
$(VENV)/.installed: $(VENV)/.runtime pyproject.toml
	@echo "make: installing the test and benchmark tools into $(VENV) (extras dev, bench, tooz-test)"
	$(VENV)/bin/pip install -q -e '.[dev,bench,tooz-test]'
	touch $@

clean:
	rm -rf $(VENV) build *.egg-info
