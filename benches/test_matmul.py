"""The matmul family (gemm itself is in test_ops.py): cases from configs/<op>.yaml."""


def test_gemm_rowwise(backend, inputs, bench):
    bench(backend, *inputs)


def test_bmm(backend, inputs, bench):
    bench(backend, *inputs)


def test_linear(backend, inputs, bench):
    bench(backend, *inputs)


def test_grouped_gemm(backend, inputs, bench):
    bench(backend, *inputs)
