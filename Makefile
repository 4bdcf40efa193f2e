# The two commands a newcomer needs:  `make run`  and  `make test`.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV ?= .venv
BIN := $(VENV)/bin
HOST ?= 127.0.0.1
PORT ?= 8000
WORKERS ?= 3
# What the service writes (config/settings.py reads the same JOBQUEUE_VAR_DIR).
VAR_DIR ?= $(or $(JOBQUEUE_VAR_DIR),var)
# prometheus-client multiprocess mode: gunicorn's workers write their counters here and
# /metrics adds them up. `make run` empties it at start (stale files would count twice).
# Per port, like gunicorn's control socket: two `make run PORT=...` from one checkout share
# neither.
PROMETHEUS_DIR ?= $(VAR_DIR)/prometheus-$(PORT)
CONTROL_SOCKET ?= $(VAR_DIR)/gunicorn-$(PORT).ctl
TEST_DATABASE_URL ?= postgres://postgres@127.0.0.1:5432/jobqueue
export JOBQUEUE_REAPER_INTERVAL_SECONDS ?= 5

.PHONY: run test screenshots venv install install-dev migrate lint check clean bench

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

# The version files too: the installed distributions' metadata carries the version.
$(VENV)/.installed: requirements.txt pyproject.toml clients/python/pyproject.toml \
  jobqueue/__init__.py clients/python/jobqueue_client/version.py | $(BIN)/python
	$(BIN)/pip install --quiet -r requirements.txt
	$(BIN)/pip install --quiet --no-deps --force-reinstall -e . -e ./clients/python
	touch $@

$(VENV)/.installed-dev: requirements-dev.txt $(VENV)/.installed
	$(BIN)/pip install --quiet -r requirements-dev.txt
	touch $@

install: $(VENV)/.installed
install-dev: $(VENV)/.installed-dev

# A PostgreSQL DATABASE_URL whose server or database is missing stops here with a hint
# (scripts/check_postgres.py), not in a traceback.
migrate: install
	@$(BIN)/python scripts/check_postgres.py --database "$$DATABASE_URL"
	$(BIN)/python manage.py migrate --noinput

# Runs the service on SQLite (var/jobqueue.sqlite3) unless DATABASE_URL says otherwise:
# migrates, collects static files, prints demo credentials, then serves with gunicorn while
# maintenance (the reaper, the pruner: run_maintenance --loop) runs beside it. Ctrl-C stops both.
# `make run PORT=8001` (HOST=0.0.0.0, WORKERS=N) serves elsewhere.
run: migrate
	$(BIN)/python manage.py collectstatic --noinput -v0
	$(BIN)/python manage.py bootstrap_demo
	@echo "Serving on http://$(HOST):$(PORT)/  (API under /v1/, admin under /admin/)"
	@rm -rf "$(PROMETHEUS_DIR)" && mkdir -p "$(PROMETHEUS_DIR)"
	@set -m; \
	$(BIN)/python manage.py run_maintenance --loop & MAINTENANCE=$$!; \
	trap 'kill -TERM $$MAINTENANCE 2>/dev/null; wait $$MAINTENANCE 2>/dev/null' EXIT INT TERM; \
	PROMETHEUS_MULTIPROC_DIR="$(abspath $(PROMETHEUS_DIR))" \
	$(BIN)/gunicorn -c config/gunicorn.conf.py --bind $(HOST):$(PORT) --workers $(WORKERS) \
	  --control-socket "$(abspath $(CONTROL_SOCKET))" --access-logfile -

# Installs the test tools, then runs the suite in three passes: the unit layer (tests/unit,
# no database at all), then integration + acceptance (tests/integration, tests/e2e) on SQLite
# and on PostgreSQL (TEST_DATABASE_URL; pytest creates and drops its own test_* database
# there). The two database passes run at the same time (TEST_PASSES_AT_ONCE=1: one after the
# other), each into its own log under $(TEST_LOG_DIR)/, printed when both have ended: they
# share nothing but the machine, and their tests spend much of their time waiting on leases
# and processes (docs/testing.md). Every pass runs under coverage (branch coverage,
# subprocesses included; COVERAGE=0: none); the data is combined into one report, printed, and
# written under $(COVERAGE_DIR)/ (html/, coverage.xml). `make test` fails when coverage is
# under the floor (pyproject.toml, fail_under); a partial run (PYTEST_ARGS naming a subset)
# can set COVERAGE_FAIL_UNDER=0. A pass whose selection is empty (pytest's exit status 5) is
# not a failure.
COVERAGE ?= 1
COVERAGE_DIR ?= var/coverage
COVERAGE_FAIL_UNDER ?=
COVERAGE_RUN = COVERAGE_FILE="$(abspath $(COVERAGE_DIR))/.coverage" $(BIN)/coverage
ifeq ($(COVERAGE),0)
PYTEST_RUN = $(BIN)/python -m pytest
else
PYTEST_RUN = $(COVERAGE_RUN) run -m pytest
endif
TEST_PASSES_AT_ONCE ?= 2
TEST_LOG_DIR ?= var/test-logs
PASS_OK = rc=$$?; [ $$rc -eq 0 ] || [ $$rc -eq 5 ] || exit $$rc
SQLITE_PASS = env -u DATABASE_URL $(PYTEST_RUN) -m "not postgres_only" tests/integration \
  tests/e2e $(PYTEST_ARGS)
POSTGRES_PASS = DATABASE_URL="$(TEST_DATABASE_URL)" $(PYTEST_RUN) tests/integration tests/e2e \
  $(PYTEST_ARGS)

test: install-dev
	@$(BIN)/python scripts/check_postgres.py "$(TEST_DATABASE_URL)"
	@sh scripts/ensure_chromium.sh
	@sh scripts/ensure_pgbouncer.sh
	@sh scripts/ensure_nginx.sh
	@sh scripts/ensure_systemd_analyze.sh
	@rm -rf $(COVERAGE_DIR) $(TEST_LOG_DIR) && mkdir -p $(COVERAGE_DIR) $(TEST_LOG_DIR)
	env -u DATABASE_URL $(PYTEST_RUN) tests/unit $(PYTEST_ARGS); $(PASS_OK)
ifeq ($(TEST_PASSES_AT_ONCE),1)
	$(SQLITE_PASS); $(PASS_OK)
	$(POSTGRES_PASS); $(PASS_OK)
else
	@echo "SQLite and PostgreSQL passes at once, logs in $(TEST_LOG_DIR)/ (shown when both end)"
	@started=$$(date +%s); \
	( $(SQLITE_PASS) > $(TEST_LOG_DIR)/sqlite.log 2>&1; echo $$? > $(TEST_LOG_DIR)/sqlite.rc; \
	  echo "SQLite pass ended after $$(( $$(date +%s) - started )) s" ) & \
	( $(POSTGRES_PASS) > $(TEST_LOG_DIR)/postgres.log 2>&1; \
	  echo $$? > $(TEST_LOG_DIR)/postgres.rc; \
	  echo "PostgreSQL pass ended after $$(( $$(date +%s) - started )) s" ) & \
	wait; failed=0; \
	for pass in sqlite postgres; do echo "==== the $$pass pass"; cat $(TEST_LOG_DIR)/$$pass.log; done; \
	for pass in sqlite postgres; do \
	  rc=$$(cat $(TEST_LOG_DIR)/$$pass.rc); \
	  if [ "$$rc" = 0 ] || [ "$$rc" = 5 ]; then echo "the $$pass pass: $$(tail -n 1 $(TEST_LOG_DIR)/$$pass.log)"; \
	  else failed=$$rc; echo "the $$pass pass FAILED (exit status $$rc):"; \
	    sed -n '/short test summary info/,$$p' $(TEST_LOG_DIR)/$$pass.log; fi; \
	done; exit $$failed
endif
ifneq ($(COVERAGE),0)
	@$(COVERAGE_RUN) combine -q
	@$(COVERAGE_RUN) html -q --fail-under=0 -d $(COVERAGE_DIR)/html
	@$(COVERAGE_RUN) xml -q --fail-under=0 -o $(COVERAGE_DIR)/coverage.xml
	@echo "coverage report: $(COVERAGE_DIR)/html/index.html, $(COVERAGE_DIR)/coverage.xml"
	$(COVERAGE_RUN) report $(if $(COVERAGE_FAIL_UNDER),--fail-under=$(COVERAGE_FAIL_UNDER))
endif

# Benchmarks, not part of `make test` (docs/performance.md): the peers go into their own
# virtualenv (.venv-bench, requirements-bench.txt), never into the app's. Takes ~30-40 min on
# 2 cores; sizes and scenarios: BENCH_ARGS="core http" and BENCH_* variables (benchmarks/sizes.py).
# Its databases are named after TEST_DATABASE_URL's (jq_bench -> jq_bench_core, jq_bench_pgbench...).
.venv-bench/.installed: requirements-bench.txt
	$(PYTHON) -m venv .venv-bench
	.venv-bench/bin/pip install --quiet -r requirements-bench.txt
	touch $@

bench: install .venv-bench/.installed
	@$(BIN)/python scripts/check_postgres.py "$(TEST_DATABASE_URL)"
	@command -v pgbench >/dev/null || { apt-get update -qq && apt-get install -y -qq postgresql-contrib; }
	@case " $(BENCH_ARGS) " in *" pgbouncer "*) sh scripts/ensure_pgbouncer.sh;; esac
	BENCH_DATABASE_URL="$(TEST_DATABASE_URL)" $(BIN)/python -m benchmarks.run $(BENCH_ARGS)

# Refreshes the admin screenshots that README.md shows (the browser test takes them).
screenshots: install-dev
	@sh scripts/ensure_chromium.sh
	env -u DATABASE_URL JOBQUEUE_SCREENSHOTS_DIR=docs/screenshots $(BIN)/pytest -q tests/integration/admin/test_browser.py

lint: install-dev
	$(BIN)/ruff check .
	$(BIN)/lint-imports
	$(BIN)/python manage.py makemigrations --check --dry-run
	$(BIN)/python manage.py spectacular --validate --fail-on-warn --file /dev/null
	sh scripts/check_monitoring.sh

clean:
	rm -rf $(VENV) var/*.sqlite3* var/static
