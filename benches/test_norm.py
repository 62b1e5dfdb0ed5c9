"""The norm ops: one bench test per op, its cases from configs/<op>.yaml."""


def test_layernorm(backend, inputs, bench):
    bench(backend, *inputs)


def test_add_rmsnorm(backend, inputs, bench):
    bench(backend, *inputs)


def test_rmsnorm(backend, inputs, bench):
    bench(backend, *inputs)
