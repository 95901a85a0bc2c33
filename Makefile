# The two commands of the README. Both set up .venv first (idempotent).
.PHONY: setup demo test test-all

setup:
	bash scripts/setup.sh

demo: setup
	.venv/bin/flopwise train

test: setup
	.venv/bin/python -m pytest

test-all: setup
	.venv/bin/python -m pytest -m "slow or not slow"
