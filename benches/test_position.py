"""The position ops: one bench test per op, its cases from configs/<op>.yaml."""


def test_rope(backend, inputs, bench):
    bench(backend, *inputs)
