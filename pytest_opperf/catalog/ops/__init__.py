"""The built-in ops, one module per op, grouped in a folder per family (matmul/, norm/, ...).

Each module registers its op and the op's eager torch backend (the baseline of the op);
`catalog.load_builtin()` imports every module here, so adding an op is adding a file.
"""
