# The two commands of the README. Each sets up .venv on a fresh machine first (scripts/setup.sh).
.PHONY: setup quickstart test lint

# The data folder of the quickstart and the tests, unless CSEKIT_DATA names one: ../shared/data beside the checkout.
export CSEKIT_DATA ?= $(abspath $(CURDIR)/../shared/data)

setup:
	bash scripts/setup.sh

quickstart: setup
	bash scripts/quickstart.sh

test: setup lint
	.venv/bin/python -m pytest -q

lint: setup
	.venv/bin/ruff check src tests benchmarks examples
	.venv/bin/ruff format --check src tests benchmarks examples
