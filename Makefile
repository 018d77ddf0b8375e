# OpsPlanner: `make run` (embedded default, nothing but Python) and `make test` (PostgreSQL + Redis).
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

# Tests run against real servers; these are the defaults for a developer machine.
TEST_DATABASE_URL ?= postgresql://postgres@127.0.0.1:5432/opsplanner
TEST_REDIS_URL ?= redis://127.0.0.1:6379/15
# What mypy checks: every room of the house and the adapters package.
TYPED := config opsplanner fleet trains console simulation drawing bench adapters/src

.PHONY: run test lint format typecheck bench clean

$(STAMP): requirements.lock pyproject.toml
	@test -d $(VENV) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -r requirements.lock
	@touch $(STAMP)

run: $(STAMP)
	DEBUG=$${DEBUG:-1} $(PY) manage.py serve

test: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	DEBUG=1 DATABASE_URL=$${DATABASE_URL:-$(TEST_DATABASE_URL)} REDIS_URL=$${REDIS_URL:-$(TEST_REDIS_URL)} \
		$(VENV)/bin/mypy $(TYPED)
	DEBUG=1 DATABASE_URL=$${DATABASE_URL:-$(TEST_DATABASE_URL)} REDIS_URL=$${REDIS_URL:-$(TEST_REDIS_URL)} \
		$(PY) scripts/check_services.py
	DEBUG=1 DATABASE_URL=$${DATABASE_URL:-$(TEST_DATABASE_URL)} REDIS_URL=$${REDIS_URL:-$(TEST_REDIS_URL)} \
		$(PY) manage.py check --fail-level WARNING
	DEBUG=1 DATABASE_URL=$${DATABASE_URL:-$(TEST_DATABASE_URL)} REDIS_URL=$${REDIS_URL:-$(TEST_REDIS_URL)} \
		$(PY) manage.py makemigrations --check --dry-run
	DEBUG=1 DATABASE_URL=$${DATABASE_URL:-$(TEST_DATABASE_URL)} REDIS_URL=$${REDIS_URL:-$(TEST_REDIS_URL)} \
		$(PY) -m pytest $(PYTEST_ARGS)

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

format: $(STAMP)
	$(VENV)/bin/ruff check --fix .
	$(VENV)/bin/ruff format .

# mypy with django-stubs and djangorestframework-stubs ([tool.mypy] in pyproject.toml); the Django
# plugin loads the settings, hence the same environment as the tests.
typecheck: $(STAMP)
	DEBUG=1 DATABASE_URL=$${DATABASE_URL:-$(TEST_DATABASE_URL)} REDIS_URL=$${REDIS_URL:-$(TEST_REDIS_URL)} \
		$(VENV)/bin/mypy $(TYPED)

bench: $(STAMP)
	DEBUG=1 DATABASE_URL=$${DATABASE_URL:-$(TEST_DATABASE_URL)} REDIS_URL=$${REDIS_URL:-$(TEST_REDIS_URL)} \
		$(PY) -m bench all --write BENCHMARKS.md

clean:
	rm -rf $(VENV) var .pytest_cache .ruff_cache
