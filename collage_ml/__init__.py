"""collage-ml: Collage-style multi-backend placement with a learned cost model."""

__version__ = "0.1.0"

from collage_ml.api import export_zoo, import_model, inspect_model  # noqa: E402
from collage_ml.errors import CollageError  # noqa: E402

__all__ = ["CollageError", "export_zoo", "import_model", "inspect_model", "__version__"]
