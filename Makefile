# cronwheel: `make run` for the whole local system, `make test` for the suite.
SHELL := /bin/bash
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
CW := $(BIN)/cronwheel
STAMP := $(VENV)/.installed

.DEFAULT_GOAL := help

help: ## list the targets
	@grep -E '^[a-zA-Z_-]+:.*?## ' $(MAKEFILE_LIST) | awk -F':.*?## ' '{printf "  %-17s %s\n", $$1, $$2}'

# '.[test]' includes '.[server]' (the platform); a worker needs neither: pip install cronwheel.
$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[test]'
	touch $(STAMP)

install: system-deps $(STAMP) $(BIN)/promtool ## create .venv and install cronwheel with its test tools

# promtool, Prometheus's rule checker, for tests/unit/test_observability.py
# (the alert rules parsed and unit-tested, the dashboard's queries parsed):
# the one binary taken out of Debian's prometheus package, which is not
# installed (it would bring a server, a user and web assets). Where it cannot
# be had, those tests skip and the rules are checked against the metric names.
$(BIN)/promtool: | $(STAMP)
	@if command -v promtool >/dev/null; then ln -sf "$$(command -v promtool)" $@; \
	elif command -v apt-get >/dev/null && d=$$(mktemp -d) && (cd $$d && apt-get download -q prometheus >/dev/null 2>&1); then \
	  dpkg-deb --fsys-tarfile $$d/prometheus_*.deb | tar -xO ./usr/bin/promtool > $@.tmp \
	    && chmod 755 $@.tmp && mv $@.tmp $@; rm -rf $$d $@.tmp; \
	else echo "hint: the alert rules' promtool tests need promtool; run: sudo apt-get install prometheus"; fi

system-deps: ## Debian packages: bubblewrap for the managed executor, chromium for the console's browser tests
	@# nft: the egress rules of managed runs with network (docs/managed-execution.md)
	@if ! command -v bwrap >/dev/null || ! command -v nft >/dev/null; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    apt-get update -q && apt-get install -y -q bubblewrap nftables; \
	  else \
	    echo "hint: the managed executor needs bwrap and nft; run: sudo apt-get install bubblewrap nftables"; \
	  fi; \
	fi
	@# faketime: libfaketime, the fault harness's clock skew (docs/reliability.md)
	@if ! command -v faketime >/dev/null; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    apt-get update -q && apt-get install -y -q faketime; \
	  else \
	    echo "hint: the fault harness's clock skew needs libfaketime; run: sudo apt-get install faketime"; \
	  fi; \
	fi
	@# Playwright drives this system browser (tests/e2e/test_console.py); it
	@# never downloads one of its own.
	@if ! command -v chromium >/dev/null; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium; \
	  else \
	    echo "hint: the console's browser tests need chromium; run: sudo apt-get install chromium"; \
	  fi; \
	fi
.PHONY: system-deps

up: install ## start the local PostgreSQL and Kafka (no Docker)
	$(CW) up

down: ## stop the local stack
	@if [ -x $(CW) ]; then $(CW) down; fi

migrate: up ## apply pending expand migrations (contract steps wait for `cronwheel migrate --contract`)
	$(CW) migrate

schema: up ## regenerate cronwheel/store/schema.sql from the migrations (commit it with a new migration)
	$(CW) migrate --dump-schema

run: migrate ## the whole system: stack, migrations, every service, demo tenant
	$(CW) dev --demo

lint: install ## ruff lint and format check; import-linter's layer contracts (pyproject.toml)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/lint-imports --no-logo

check-schemas: install ## every Avro schema version reads and is read by every other version of its record (full transitive)
	$(BIN)/python -m cronwheel.core.schema_compat schemas

check-migrations: install ## squawk: no migration takes a blocking lock or rewrites a table unless it says why (.squawk.toml)
	$(BIN)/python -m cronwheel.store.migration_lint
	$(BIN)/python -m cronwheel.store.migration_lint cronwheel/store/directory_migrations

check-api: install ## the OpenAPI document only grows against the previous release's (oasdiff, installed with Go)
	$(BIN)/python -m services.gateway.api_check

api-baseline: install ## at a release: the current OpenAPI document becomes the baseline check-api compares with
	$(BIN)/python -m services.gateway.api_check --write-baseline

unit: install ## the pure tests, no servers
	$(BIN)/pytest tests/unit -q

# Tests wait on servers and services far more than they compute: with three
# workers the whole clean-clone run used 1,672 CPU-seconds in 1,369 s on two
# cores (61%, 2026-12-03, every process sampled each second), so a fourth
# worker has room. A test file stays on one worker (loadfile), so a file's
# tests that share a fixed resource never overlap; the longest files start
# first (tests/conftest.py, LONGEST_FIRST).
TEST_WORKERS ?= 4
# --durations: every run (and CI's log) names its slowest tests, where the
# 15-minute budget goes.

test: install lint check-schemas check-migrations check-api migrate ## install, bring the stack up, run the whole suite
	$(BIN)/pytest -q -n $(TEST_WORKERS) --dist loadfile --durations=25

# In make test too: the suite's pytest collects tests/upgrade with the rest.
test-upgrade: migrate ## the previous release (RELEASES) on this release's expand schema; its timer beside this release's services
	$(BIN)/pytest -q tests/upgrade

bench: migrate ## benchmarks under bench/, printing their figures
	@for b in bench/bench_*.py; do echo "== $$b"; $(BIN)/python $$b || exit 1; done
	@# The dispatch path again, with the worker protocol's CPU off these cores.
	@echo "== bench/bench_lifecycle.py --hold-only"; $(BIN)/python bench/bench_lifecycle.py --hold-only

chaos: install ## the fault scenarios' long versions on a private stack (ports 26432, 29392): one line each
	$(BIN)/python -m tests.faults

clean: down ## stop the stack and remove local state (keeps the Kafka jar cache)
	rm -rf .cronwheel

.PHONY: help install up down migrate schema run lint check-schemas check-migrations check-api api-baseline unit test test-upgrade bench chaos clean
