"""Model directories the engine can load: synthetic random-weight shapes, made on demand."""

from pathlib import Path

from appliance.models.synthetic import SHAPES, TINY, ensure, synthetic_dir

__all__ = ["SHAPES", "TINY", "ensure", "materialize", "synthetic_dir"]


def materialize(model) -> Path:
    """The directory holding a ModelPlan's weights, writing a synthetic model the first time."""
    if model.synthetic:
        s = model.synthetic
        return ensure(s["shape"], model.dtype, s["bits"], s["seed"])
    return Path(model.path)
