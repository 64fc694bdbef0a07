import logging
import os
import random

import pytest

# keep exports cached inside the test session's temp area unless the user set a cache
os.environ.setdefault("COLLAGE_ML_CACHE", os.path.join(os.path.dirname(__file__), "..", ".cache"))
logging.getLogger("torch.onnx").setLevel(logging.ERROR)
# the suite runs on two pytest-xdist workers (Makefile): each one's load is known, so CPU pressure is not read,
# or every measurement would come out contended and be retried instead of cached (measure/timing.py)
os.environ.setdefault("COLLAGE_ML_CPU_PRESSURE", "off")


@pytest.fixture
def rng():
    return random.Random(0)
