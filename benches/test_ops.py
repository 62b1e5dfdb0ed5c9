"""One bench test per op: its cases come from configs/<op>.yaml.

`bench(backend, *inputs)` checks the backend's output against the op's reference,
then times it and records the row.
"""


def test_gemm(backend, inputs, bench):
    bench(backend, *inputs)


def test_add(backend, inputs, bench):
    bench(backend, *inputs)


def test_gelu(backend, inputs, bench):
    bench(backend, *inputs)


def test_softmax(backend, inputs, bench):
    bench(backend, *inputs)


def test_rmsnorm(backend, inputs, bench):
    bench(backend, *inputs)
