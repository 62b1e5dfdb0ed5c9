"""The matmul ops: one bench test per op, its cases from configs/<op>.yaml.

`bench(backend, *inputs)` checks the backend's output against the op's reference,
then times it and records the row.
"""


def test_gemm(backend, inputs, bench):
    bench(backend, *inputs)


def test_gemm_rowwise(backend, inputs, bench):
    bench(backend, *inputs)


def test_bmm(backend, inputs, bench):
    bench(backend, *inputs)


def test_linear(backend, inputs, bench):
    bench(backend, *inputs)


def test_grouped_gemm(backend, inputs, bench):
    bench(backend, *inputs)
