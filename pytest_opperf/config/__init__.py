"""The config language: configs/<op>.yaml read, validated and expanded into Cases, without pytest.

    yamlfile.py     the strict YAML reader, ConfigError ('file: key: what was expected')
    grid.py         parameter values and {min, max, step|mul} ranges, the grid they span
    expressions.py  exclude, max_regression and constraints: vetted expressions over a case
    search.py       a backend's `search:`, a seeded sample of a knob grid
    knobs.py        the knobs a backend's callable takes
    opconfig.py     `load`: one file -> an OpConfig; `OpConfig.expand` -> the Cases

It imports only the leaves (case, record, amounts, files, the dtype table in pytest_opperf/dtypes.py),
so the pipeline that writes configs validates them with the loader users' configs go through.
The run layer turns a ConfigError into pytest's collection or usage error (run/collect.py).

    >>> from pytest_opperf.config import ConfigError, load    # doctest: +SKIP
    >>> load("configs/gemm.yaml", ("m", "n", "k"), {}).count() # doctest: +SKIP
    24
"""

from pytest_opperf.config.opconfig import BackendSpec, OpConfig, load  # noqa: F401  (the package's public view)
from pytest_opperf.config.yamlfile import ConfigError  # noqa: F401
