# The two commands of the README. Each sets up .venv on a fresh machine first (scripts/setup.sh).
.PHONY: setup quickstart test test-quick lint

# The data folder of the quickstart and the tests, unless CSEKIT_DATA names one: ../shared/data beside the checkout.
export CSEKIT_DATA ?= $(abspath $(CURDIR)/../shared/data)

setup:
	bash scripts/setup.sh

quickstart: setup
	bash scripts/quickstart.sh

# Both print the 15 slowest tests at the end. test-quick runs the tests marked quick (conftest.py: QUICK_FILES),
# a subset that imports every module of src/csekit (tests/test_quick_subset.py checks it).
test: setup lint
	.venv/bin/python -m pytest -q --durations=15

test-quick: setup lint
	.venv/bin/python -m pytest -q -m quick --durations=15

lint: setup
	.venv/bin/ruff check src tests benchmarks examples
	.venv/bin/ruff format --check src tests benchmarks examples
