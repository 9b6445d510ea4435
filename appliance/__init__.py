"""appliance: a declarative LLM serving appliance on MLX."""

from appliance import _blas, _mlx_env

_blas.preload()  # before any module imports mlx
_mlx_env.apply()  # before MLX reads its settings

__version__ = "0.1.0"
