import logging
import os
import random

import pytest

# keep exports cached inside the test session's temp area unless the user set a cache
os.environ.setdefault("COLLAGE_ML_CACHE", os.path.join(os.path.dirname(__file__), "..", ".cache"))
logging.getLogger("torch.onnx").setLevel(logging.ERROR)


@pytest.fixture
def rng():
    return random.Random(0)
