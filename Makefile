# Both targets set everything up on a fresh machine (idempotently, into .venv/).
PY := .venv/bin/python
MODEL ?= resnet50

.PHONY: setup demo test clean

setup:
	@bash scripts/setup.sh

# the main job: place $(MODEL) on the default CPU backends in guided mode: the shipped cost model
# predicts every candidate and only the few that can matter are measured (measurements are cached in
# ~/.cache/collage-ml/measurements.db and the updated model is saved next to it)
demo: setup
	$(PY) -m collage_ml.cli place $(MODEL) --mode guided --max-region-size 2 --report .cache/demo/report.json --out .cache/demo/placed

test: setup
	$(PY) -m pytest -q -p no:cacheprovider

clean:
	rm -rf .venv .cache .pytest_cache
