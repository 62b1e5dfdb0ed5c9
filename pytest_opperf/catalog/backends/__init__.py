"""Backends by library: one module per library (or a folder, for our own Triton kernels), each
registering its callables for the ops it covers. A library that is not installed leaves its
backends registered but skipped, with the package named in the reason."""
