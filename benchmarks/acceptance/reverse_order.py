"""A pytest plugin that runs the collected cases in reverse order (after every other plugin's
selection, sharding and ordering): benchmarks/acceptance/speed.py compares README's main command in its
order with the same command in reverse, to show a row does not depend on the case before it.

    PYTHONPATH=benchmarks/acceptance python3 -m pytest benches/ -p reverse_order
"""

import pytest


@pytest.hookimpl(wrapper=True)
def pytest_collection_modifyitems(items):
    result = yield  # every implementation first, trylast ones included
    items.reverse()
    return result
