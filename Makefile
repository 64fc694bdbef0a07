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

# two workers (pytest-xdist), one per core of this project's 2-core machines; a test file stays on one worker
# (--dist loadfile), so its module fixtures are built once. tests/conftest.py turns CPU-pressure reading off,
# so one worker's load does not mark the other's measurements contended (measure/timing.py)
test: setup
	$(PY) -m pytest -q -p no:cacheprovider -n 2 --dist loadfile

clean:
	rm -rf .venv .cache .pytest_cache
