# The two commands of the README. Each sets up .venv on a fresh machine first (scripts/setup.sh).
.PHONY: setup quickstart test test-fast test-hostile lint

# The data folder of the quickstart and the tests, unless CSEKIT_DATA names one: ../shared/data beside the checkout.
export CSEKIT_DATA ?= $(abspath $(CURDIR)/../shared/data)

setup:
	bash scripts/setup.sh

quickstart: setup
	bash scripts/quickstart.sh

# pytest-xdist workers: auto is one per CPU core (2 on a 2-core machine; conftest.py gives each worker its share
# of the cores' threads). PYTEST_WORKERS=0 runs the tests serially in one process: make test PYTEST_WORKERS=0
# worksteal gives each worker a contiguous half of the tests and rebalances at the end: the whole suite took
# 11 min 23 s on 2 cores, against 16 min 49 s with xdist's default (load), which deals a file's tests to both
# workers (its module fixtures built twice, its 2-process trainings side by side: load average 4 against 2.5).
PYTEST_WORKERS ?= auto

# Both print the 15 slowest tests at the end. test runs every tier of tests/ (unit, methods, runs, invariants);
# test-fast runs the tests marked fast (conftest.py: FAST_FOLDERS, tests/unit/ and tests/invariants/architecture/),
# a tier that imports every module of src/csekit (tests/invariants/architecture/test_tiers.py checks it).
test: setup lint
	.venv/bin/python -m pytest -q -n $(PYTEST_WORKERS) --dist worksteal --durations=15

test-fast: setup lint
	.venv/bin/python -m pytest -q -n $(PYTEST_WORKERS) --dist worksteal -m fast --durations=15

# The property tests of hostile input (generated files, --set values, report names, write targets), with fresh
# random examples and 40 times as many as make test draws (conftest.py: CSEKIT_HYPOTHESIS=long, hostile_examples);
# make test runs them bounded, on a fixed seed. Minutes, not part of make test.
HOSTILE_TESTS = tests/invariants/test_fuzz_files.py tests/invariants/test_fuzz_readers.py tests/invariants/test_report_cells.py \
	tests/invariants/test_hostile_v.py tests/invariants/test_hostile_v_scripts.py

test-hostile: setup
	CSEKIT_HYPOTHESIS=long .venv/bin/python -m pytest -q -n $(PYTEST_WORKERS) --dist worksteal $(HOSTILE_TESTS)

lint: setup
	.venv/bin/ruff check src tests benchmarks examples
	.venv/bin/ruff format --check src tests benchmarks examples
