"""The quant ops: one bench test per op, its cases from configs/<op>.yaml."""


def test_quant_fp8(backend, inputs, bench):
    bench(backend, *inputs)


def test_quant_int8(backend, inputs, bench):
    bench(backend, *inputs)
