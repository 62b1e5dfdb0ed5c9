"""Recorded calls replayed as themselves: the `aten` op's cases come from configs/aten.yaml, or from
the configs `opperf import --configs DIR` writes for a profile."""


def test_aten(backend, inputs, bench):
    bench(backend, *inputs)
