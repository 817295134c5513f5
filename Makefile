# The README's two commands: `make test` and `make demo`. Both work from a clean clone.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: test demo soak lint format docs system-deps bench clean

# --no-compile: Python compiles a module when it is first imported instead. pip compiled every
# module it installed (pyspark's thousands, most never imported here): half the install.
$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q --no-compile -e '.[dev]'
	@touch $(STAMP)

system-deps:
	@bash .ci/system-deps.sh

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

format: $(STAMP)
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

# The manual (docs/, mkdocs-material), built strictly: a broken link or anchor, or a page
# missing from the nav, fails it. `$(BIN)/mkdocs serve` shows it while you write.
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --quiet --site-dir site

# Three workers by default (TEST_JOBS=1 for one process); a file's tests stay on one worker.
TEST_JOBS ?= 3
test: system-deps $(STAMP) lint docs
	$(BIN)/pytest -q -n $(TEST_JOBS) --dist loadfile --durations=15

# The long soak (writers + killed syncs; `make test` runs a 30-second version).
SOAK_SECONDS ?= 600
soak: system-deps $(STAMP)
	REPLICATOR_SOAK_SECONDS=$(SOAK_SECONDS) $(BIN)/pytest -q -s tests/test_soak.py

demo: system-deps $(STAMP)
	$(BIN)/replicator demo --project-dir .
	@echo "The command is $(BIN)/replicator (source $(BIN)/activate puts it on PATH); for your own project see docs/getting-started.md."

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache *.egg-info site
