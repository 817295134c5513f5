# The README's two commands: `make test` and `make demo`. Both work from a clean clone.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: test demo soak lint format docs system-deps bench clean bytecode

# --no-compile, then compileall of all but pyspark: pip compiled every module it installed,
# pyspark's thousands too (most never imported here), which was half the install. Yet each
# module a command imports must be compiled here: where PYTHONDONTWRITEBYTECODE is set (many
# Docker images set it), Python never writes the bytecode it compiles at an import, and every
# run of the tool would compile its modules again. The package's own (an editable install)
# too; after an edit, `make bytecode` compiles what changed.
$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q --no-compile -e '.[dev]'
	@$(MAKE) --no-print-directory bytecode
	@touch $(STAMP)

bytecode:
	@$(BIN)/python -m compileall -q -j 0 -x '/pyspark/' $(VENV)/lib replicator > /dev/null || true

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
