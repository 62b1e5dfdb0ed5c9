"""The attention family: cases from configs/<op>.yaml."""


def test_attention_prefill(backend, inputs, bench):
    bench(backend, *inputs)


def test_attention_decode(backend, inputs, bench):
    bench(backend, *inputs)


def test_paged_decode(backend, inputs, bench):
    bench(backend, *inputs)


def test_mla_decode(backend, inputs, bench):
    bench(backend, *inputs)
