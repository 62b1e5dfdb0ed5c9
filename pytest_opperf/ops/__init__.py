"""The built-in ops; importing this package registers them and their torch backends."""

from . import add, gelu, gemm, rmsnorm, softmax  # noqa: F401
