"""The seed-001 pipeline: from a model's profile to a replayed, explained performance database.

    signature.py    profiled calls and their aggregation into signatures
    events.py       a Chrome trace JSON read one event at a time (bounded memory)
    trace.py        torch.profiler Chrome/Kineto traces (CPU self time or device kernel time)
    capture.py      what the profiler does not record (grouped-GEMM offsets, index counts), saved beside the trace
    ascend.py       Ascend kernel_details*.csv files
    hccl.py         Ascend collectives sized from communication.json, grouped through their @suffix
    mapping.py      profiled op types -> catalogue ops and parameters (data/mapping.yaml)
    profile.py      the profile database (opperf import) and its replay configs
    configs.py      planned cases -> cases: configs that `pytest benches/ --opperf-config=...` runs,
                    dumped as YAML and loaded back by pytest_opperf/config (the users' loader)
    models.py       public model configs (data/models/*.yaml, HF config.json fields with sources)
    shapes.py       the cases a model's layers run, per TP size, batch, length and phase
    cachestate.py   the cache state each signature replays in (hot where its inputs fit the L2)
    tag.py          a pytest plugin: replayed rows carry their signature ids (signatures.json)
    backfill.py     replayed times from a results database into the profile database, by those ids
    replay_report.py  profiled vs replayed, by share of the profiled time
    lookup.py       measured, interpolated or roofline time of a case
    commands.py     the `opperf` commands over these

It reads results databases (through store/results.py) and never writes them. It knows nothing of
pytest or of run/; dtype spellings resolve in pytest_opperf/dtypes.py.
"""
