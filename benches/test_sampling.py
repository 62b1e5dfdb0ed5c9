"""The sampling ops: one bench test per op, its cases from configs/<op>.yaml."""


def test_sampling(backend, inputs, bench):
    bench(backend, *inputs)


def test_cross_entropy(backend, inputs, bench):
    bench(backend, *inputs)


def test_sort(backend, inputs, bench):
    bench(backend, *inputs)
