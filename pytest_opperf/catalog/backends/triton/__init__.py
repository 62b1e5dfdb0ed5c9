"""Our own Triton kernels, one module per kernel, each registered as backend `triton` of its op.

Their launch parameters are tuning knobs a config can sweep
(`backends: {triton: {knobs: {BLOCK_SIZE: [1024, 4096], num_warps: [4, 8]}}}`); a knob value
the kernel cannot run with fails the case with a message saying why. The modules import
without triton installed (the backends are then skipped, naming the package), and compile
their kernels on first use (see `_common.kernel`).
"""
