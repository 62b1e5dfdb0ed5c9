"""The memory ops: one bench test per op, its cases from configs/<op>.yaml."""


def test_kv_cache_write(backend, inputs, bench):
    bench(backend, *inputs)


def test_embedding(backend, inputs, bench):
    bench(backend, *inputs)


def test_transpose(backend, inputs, bench):
    bench(backend, *inputs)


def test_add(backend, inputs, bench):
    bench(backend, *inputs)
