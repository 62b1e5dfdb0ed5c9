"""TimerError: what measuring raises when a time cannot be taken, or taken but not trusted.

It sits below everything else in measure/ so that the profiler-record reader, the timers and
the sampling loop raise the one class the plugin catches to fail a case; timer authors find it
as `pytest_opperf.measure.timers.TimerError`.
"""


class TimerError(RuntimeError):
    pass
