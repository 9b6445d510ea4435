"""appliance: a declarative LLM serving appliance on MLX."""

from appliance import _blas

_blas.preload()  # before any module imports mlx

__version__ = "0.1.0"
