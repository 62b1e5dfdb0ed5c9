"""The built-in ops, one module per op, grouped in a folder per family (matmul/, norm/, ...).

Each module registers its op and the op's eager torch backend (the baseline of the op);
`catalog.load_builtin()` imports every module here, so adding an op is adding a file.
"""

from pytest_opperf.catalog.ops._common import reads_float_writes, same_dtype

__all__ = ["reads_float_writes", "same_dtype"]  # the supports() checks backends elsewhere reuse
