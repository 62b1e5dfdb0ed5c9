"""The activation ops: one bench test per op, its cases from configs/<op>.yaml."""


def test_silu_and_mul(backend, inputs, bench):
    bench(backend, *inputs)


def test_gelu_and_mul(backend, inputs, bench):
    bench(backend, *inputs)


def test_gelu(backend, inputs, bench):
    bench(backend, *inputs)


def test_softmax(backend, inputs, bench):
    bench(backend, *inputs)
