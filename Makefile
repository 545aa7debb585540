# The two commands of the README. Each sets up .venv on a fresh machine first (scripts/setup.sh).
.PHONY: setup quickstart test lint

setup:
	bash scripts/setup.sh

quickstart: setup
	bash scripts/quickstart.sh

test: setup lint
	.venv/bin/python -m pytest -q

lint: setup
	.venv/bin/ruff check src tests benchmarks examples
	.venv/bin/ruff format --check src tests benchmarks examples
