# Tessera: `make demo` runs it embedded on this machine; `make test` runs the whole suite.
PYTHON ?= $(shell command -v python3.11 2>/dev/null || command -v python3)
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
COMMA := ,
HOST ?= 127.0.0.1
PORT ?= 8000

# The test suite talks to the real PostgreSQL and Redis of this machine. The behaviour tests marked both_databases
# then run again on SQLite, embedded (no Redis, tasks in process): the plain paths behind portal/database.py. Their
# test database is a file beside TEST_SQLITE_URL's, removed after the run; pytest's exit status 5 there means
# PYTEST_ARGS chose none of them.
TEST_DATABASE_URL ?= postgres://postgres@127.0.0.1:5432/tessera
TEST_REDIS_URL ?= redis://127.0.0.1:6379/15
TEST_SQLITE_URL ?= sqlite:///$(CURDIR)/var/tessera-test.sqlite3

.PHONY: install demo serve test lint format bench clean vendor

$(STAMP): pyproject.toml
	@$(PYTHON) -c 'import sys; assert sys.version_info >= (3, 11), "Tessera needs Python 3.11 or newer"'
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev$(if $(wildcard /usr/include/ldap.h),$(COMMA)ldap)]'
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(BIN)/python manage.py migrate --noinput -v0
	$(BIN)/python manage.py load_demo
	@echo "Tessera: portal on http://$(HOST):$(PORT)/ (admin: /admin/), scheduling loop and simulated agents. Ctrl-C stops it."
	REDIS_URL= $(BIN)/python manage.py run_demo --host $(HOST) --port $(PORT)

test: $(STAMP)
	DATABASE_URL=$(TEST_DATABASE_URL) REDIS_URL=$(TEST_REDIS_URL) $(BIN)/python -m pytest $(PYTEST_ARGS)
	@mkdir -p var
	DATABASE_URL=$(TEST_SQLITE_URL) REDIS_URL= $(BIN)/python -m pytest -m both_databases $(PYTEST_ARGS) || test $$? -eq 5

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/lint-imports

format: $(STAMP)
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

# The portal's browser libraries, pinned in package.json / package-lock.json, copied with their licences into
# frontend/static/vendor/ (committed: `make demo` and the tests need no Node).
VENDOR := frontend/static/vendor
vendor:
	npm ci --no-audit --no-fund
	mkdir -p $(VENDOR)/htmx $(VENDOR)/uplot
	cp node_modules/htmx.org/dist/htmx.min.js node_modules/htmx.org/LICENSE $(VENDOR)/htmx/
	cp node_modules/uplot/dist/uPlot.iife.min.js node_modules/uplot/dist/uPlot.min.css node_modules/uplot/LICENSE $(VENDOR)/uplot/
	node -e 'const l=require("./package-lock.json").packages; console.log(JSON.stringify({htmx: l["node_modules/htmx.org"].version, uplot: l["node_modules/uplot"].version}))' > $(VENDOR)/VERSIONS.json

clean:
	rm -rf $(VENV) var staticfiles .pytest_cache .ruff_cache node_modules test-artifacts
