"""The moe ops: one bench test per op, its cases from configs/<op>.yaml."""


def test_moe_gating(backend, inputs, bench):
    bench(backend, *inputs)


def test_moe_permute(backend, inputs, bench):
    bench(backend, *inputs)
