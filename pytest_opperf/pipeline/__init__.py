"""The seed-001 pipeline: from a model's profile to a replayed, explained performance database.

One subpackage per stage of the flow, in its order; a stage imports the stages before it, never a
later one (tests/test_layers.py holds it):

    reading/    profiler output in -> op instances aggregated into signatures, the calls in the order
                they ran, their links (which call wrote an input) and the leaf-module calls.
                signature.py, slots.py (a slot's type text), events.py, trace.py (torch.profiler),
                owners.py (the op a unit of time belongs to), calls.py (order and links),
                capture.py (what the profiler does not record), ascend.py, hccl.py
    mapping/    signatures -> catalogue ops and parameters, a cache state each, the profile database
                and the replay configs. rules.py (data/mapping.yaml), bind.py, generic.py,
                matmul.py, cachestate.py, profile.py (the database), configs.py, tag.py (the replay
                run's plugin: rows carry their signature ids)
    replay/     the replay's bookkeeping and the replay in context. backfill.py (replayed times into
                the profile database), report.py (profiled vs replayed), lookup.py (the time of a
                case); `opperf sequence`: plan.py builds the plan, whatif.py transforms it,
                sequence.py runs it, summary.py sums it
    predict/    a model's own calls at a configuration, traced on meta and priced with what replay
                measures. model.py (built on meta), trace.py and launches.py (the calls recorded as a
                profile), price.py (in sequence, from rows, with context factors), answer.py (`opperf
                predict`); models.py (data/models/*.yaml), shapes.py, idealised.py (--idealised)

    commands.py the `opperf` commands over these (import, shapes, backfill, replay-report, sequence,
                lookup, predict): the pipeline's face for the CLI, the one module that imports every stage

It reads results databases (through store/results.py) and never writes them. It knows nothing of
pytest or of run/; dtype spellings resolve in pytest_opperf/dtypes.py.
"""
