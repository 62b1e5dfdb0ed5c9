"""A search's time budget, at run time: a case past its shape's budget skips (pytest.skip).

The `search:` mapping itself, and the sample of knob combinations it draws, are the config
language's (config/search.py); what runs here is only the clock per searched shape.
"""

from __future__ import annotations

import contextlib
import time

import pytest


class Budgets:
    """Seconds spent per searched shape in this process; a case past its shape's budget skips."""

    def __init__(self):
        self.group_of: dict = {}  # case -> (group, budget_s, label)
        self.spent: dict = {}  # group -> (seconds, cases)

    def note(self, cfg, cases: list) -> None:
        """Remember the budget of every case of a backend whose search has one (at collection)."""
        budgets = {b.name: b.search.budget_s for b in cfg.backends if b.search is not None and b.search.budget_s}
        for case in cases:
            if case.backend in budgets:
                shape = type(case)(case.op, case.backend, None, case.dtype_in, case.dtype_out, case.params)
                label = shape.id[len(case.backend) + 1:]
                self.group_of[case] = ((str(cfg.path), shape.id), budgets[case.backend], label)

    @contextlib.contextmanager
    def charge(self, case):
        """Skip the case if its shape's budget is spent; else time it against the budget."""
        entry = self.group_of.get(case)
        if entry is None:
            yield
            return
        group, budget_s, label = entry
        spent, count = self.spent.get(group, (0.0, 0))
        if spent >= budget_s:
            pytest.skip(f"search budget of {budget_s:g} s for {label} spent ({spent:.2f} s over {count} cases "
                        f"in this process)")
        start = time.perf_counter()
        try:
            yield
        finally:
            self.spent[group] = (spent + time.perf_counter() - start, count + 1)


BUDGETS_KEY = pytest.StashKey[Budgets]()


def budgets(config: pytest.Config) -> Budgets:
    """The session's Budgets (one per process: workers collect and keep their own)."""
    if BUDGETS_KEY not in config.stash:
        config.stash[BUDGETS_KEY] = Budgets()
    return config.stash[BUDGETS_KEY]
