"""Mapping signatures to the catalogue. In: reading's signatures. Out: per signature a catalogue op,
its parameters and dtype, or why none (rules.py; a recorded aten call bound as itself, bind.py and
generic.py), the cache state it replays in (cachestate.py), the profile database (profile.py) and
the replay configs with the signatures.json their run's plugin tags rows by (configs.py, tag.py)."""
