"""What backends of several ops share: a library's import and registration helper (liger.py),
SDPA's kernel pinning and probe (sdpa.py), our Triton kernels' compile-on-first-use and knob
checks (triton.py), and the backend derived for every op (torch_compile.py). An op's own
backends live with the op, under catalog/ops/. A library that is not installed leaves its
backends registered but skipped, with the package named in the reason."""
