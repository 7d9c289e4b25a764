# millstream developer / CI entry points. `make test` is what CI runs (via .ci/run).

SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := test

PYTHON      ?= python3.11
VENV        ?= .venv
VPY         := $(VENV)/bin/python
UV          := $(VENV)/bin/uv
UV_VERSION  ?= 0.13.9
STAMP       := $(VENV)/.millstream-installed
# `make test` runs the suite on 2 pytest-xdist workers; heavy tests share one worker
# (tests/conftest.py, the "heavy" group). `make test PYTEST_ARGS=` runs it serially.
PYTEST_ARGS ?= -n 2 --dist loadgroup

# uv keeps downloaded and built wheels here (pyspark is an sdist: ~35-46s to build once).
# Installs try the cache alone first (--offline): online, uv revalidates the pyspark sdist,
# the registry answers "modified", and uv would rebuild it on every fresh venv.
export UV_CACHE_DIR ?= $(HOME)/.cache/uv
export UV_PYTHON_DOWNLOADS ?= never
# --compile-bytecode: Python here may run with PYTHONDONTWRITEBYTECODE=1, so nothing would
# ever cache bytecode and every command (and every test subprocess) would recompile what it
# imports: ~2.2 s instead of ~1.1 s to import the CLI, Spark and the API. Compiling once at
# install costs ~20 s.
uv_install = $(UV) pip install --python $(VPY) --offline --quiet --compile-bytecode $(1) 2>/dev/null \
	|| { echo "uv: cache incomplete, installing from the registry"; \
	     $(UV) pip install --python $(VPY) --compile-bytecode $(1); }

export MILLSTREAM_TEST_SPARK_MASTER ?= local[2]

.PHONY: venv system-deps test lint lock demo docs chaos clean distclean

venv: $(STAMP)

$(VPY):
	$(PYTHON) -m venv $(VENV)

$(UV): | $(VPY)
	$(VPY) -m pip install --disable-pip-version-check --quiet "uv==$(UV_VERSION)"

$(STAMP): requirements.lock pyproject.toml | $(UV)
	$(call uv_install,-r requirements.lock)
	$(call uv_install,-e '.[test]' --no-deps)
	@$(VPY) -m compileall -q -j 0 src >/dev/null
	@touch $@

system-deps:
	@if ls /usr/lib/postgresql/*/bin/pg_ctl >/dev/null 2>&1 && command -v java >/dev/null \
	  && command -v prometheus >/dev/null && command -v promtool >/dev/null \
	  && command -v chromium >/dev/null && command -v chromedriver >/dev/null; then \
	  exit 0; \
	elif [ "$$(id -u)" = 0 ]; then \
	  pkgs=""; \
	  ls /usr/lib/postgresql/*/bin/pg_ctl >/dev/null 2>&1 || pkgs="$$pkgs postgresql"; \
	  command -v java >/dev/null || pkgs="$$pkgs openjdk-17-jre-headless"; \
	  command -v promtool >/dev/null || pkgs="$$pkgs prometheus"; \
	  command -v chromium >/dev/null || pkgs="$$pkgs chromium"; \
	  command -v chromedriver >/dev/null || pkgs="$$pkgs chromium-driver"; \
	  echo "system-deps: installing$$pkgs"; \
	  apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends $$pkgs; \
	else \
	  echo "system-deps: the tests need PostgreSQL server binaries (/usr/lib/postgresql/*/bin/pg_ctl)," >&2; \
	  echo "  Java 17+ for Spark, Prometheus (prometheus, promtool) and Chromium with its" >&2; \
	  echo "  driver (chromium, chromedriver: the web console's browser test); run as root:" >&2; \
	  echo "  apt-get install -y postgresql openjdk-17-jre-headless prometheus chromium chromium-driver" >&2; \
	  echo "  (or point MILLSTREAM_PG_BIN at a directory holding initdb and postgres)" >&2; \
	  exit 1; \
	fi

lint: venv
	$(VENV)/bin/ruff check src tests $(wildcard bench)
	$(VENV)/bin/ruff format --check src tests $(wildcard bench)
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports --no-cache --no-logo
	@# a table's mode is checked only in core/engines (the merge engines' home); every module of
	@# the package imports without the test extras
	$(VPY) -m pytest -p no:cacheprovider -q tests/unit/core/test_engines_home.py tests/unit/test_package_imports.py

test: venv system-deps lint
	$(VPY) -m pytest -p no:cacheprovider $(PYTEST_ARGS)

lock: | $(UV)
	$(UV) pip compile pyproject.toml --extra test --extra demo --python-version 3.11 \
	  -o requirements.lock

demo: venv
	$(VENV)/bin/millstream demo

# docs/spec-reference.md from the spec models' field descriptions (a unit test checks it is current)
docs: venv
	$(VPY) -m millstream.cli.spec_reference

# A longer fault campaign than CI's: make chaos SEED=123 MINUTES=30 [LAYER=all|commit|process]
# [BACKEND=postgresql|sqlite] [CHAOS_ARGS="--schedules 40 --quiet ..."]; the campaigns live in the
# test tree (tests/harness/chaos), so they need the test extras: `python -m harness.chaos --help`.
SEED    ?=
MINUTES ?= 30
LAYER   ?= all
BACKEND ?= postgresql
CHAOS_ARGS ?=
chaos: venv system-deps
	PYTHONPATH=tests$${PYTHONPATH:+:$$PYTHONPATH} $(VPY) -m harness.chaos --minutes $(MINUTES) --layer $(LAYER) --backend $(BACKEND) $(if $(SEED),--seed $(SEED)) $(CHAOS_ARGS)

clean:
	rm -rf build dist .millstream .mypy_cache .ruff_cache .pytest_cache .hypothesis src/*.egg-info
	find . -path ./$(VENV) -prune -o -name __pycache__ -type d -prune -exec rm -rf {} +

distclean: clean
	rm -rf $(VENV)
