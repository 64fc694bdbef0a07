# Both targets set everything up on a fresh machine (idempotently, into .venv/).
PY := .venv/bin/python
MODEL ?= resnet50

.PHONY: setup demo test clean

setup:
	@bash scripts/setup.sh

demo: setup
	$(PY) -m collage_ml.cli inspect $(MODEL)

test: setup
	$(PY) -m pytest -q -p no:cacheprovider

clean:
	rm -rf .venv .cache .pytest_cache
