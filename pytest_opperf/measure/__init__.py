"""Measuring one case: timers, statistics and the stopping rule, device state, the functional
check and the memory estimate. Knows nothing of pytest."""
