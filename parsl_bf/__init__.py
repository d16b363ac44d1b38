"""parsl_bf: elastic DNN training on the idle nodes a batch scheduler cannot fill."""

from typing import Any

__version__ = "0.1.0"
__all__ = ["load_config"]


def __getattr__(name: str) -> Any:
    # Lazy, so that ``import parsl_bf`` stays cheap (the config loader imports Parsl and Pyomo).
    if name == "load_config":
        from .config import load_config

        return load_config
    raise AttributeError(name)
