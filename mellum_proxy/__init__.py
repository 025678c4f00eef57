"""mellum-proxy: a completion proxy that protects a local model server from an editor's request storm."""

__version__ = "0.1.0"

__all__ = ["__version__"]
