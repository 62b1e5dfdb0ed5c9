"""The built-in ops, grouped in a folder per family (matmul/, norm/, ...), each with the backends
written for it.

An op is one module, `<family>/<op>.py`: the op, its eager torch backend (the baseline of the op)
and its calls into libraries (liger's, SDPA's kernels), each registered with the library's shared
helper from catalog/backends/. An op with a backend of its own code (our Triton kernel,
flex_attention's compiled mask) is a folder `<family>/<op>/`: the op in its `__init__.py`, that
backend beside it (`triton.py`, `flex.py`). `catalog.load_builtin()` imports every module here,
so adding an op or a backend is adding or editing a file in its folder.
"""
