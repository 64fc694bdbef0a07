"""The repository's datasets as the benchmarks choose them, named once.

``datasets/<name>/measurements.db``, every one but the backend-configuration
set (``*-configs``: its backends are configurations of the others, so its
rows would count the same kernels twice). A synthetic-network set is named
``*-synth*`` (``datasets/README.md`` describes each); the machine-out
sections of ``cost_model.py`` and ``guided_replay.py --without-synthetic``
leave those out.
"""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def is_synthetic(db: Path) -> bool:
    """Whether the dataset of ``db`` (its folder) is a synthetic-network set."""
    return "synth" in Path(db).parent.name


def dataset_dbs(synthetic: bool = True, root: Path = ROOT) -> list[Path]:
    """Every shipped dataset's database, sorted by name (without the synthetic-network sets where ``synthetic``
    is False)."""
    return sorted(p for p in (root / "datasets").glob("*/measurements.db")
                  if "configs" not in p.parent.name and (synthetic or not is_synthetic(p)))
