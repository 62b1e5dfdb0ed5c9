"""Prediction. In: a model (its config.json, a built-in model of data/models/*.yaml, or a callable)
and a configuration. Out: its calls traced on the meta device, written as a profile database in the
form import writes (model.py builds it, trace.py records it, launches.py marks the calls a GPU would
launch kernels for), priced in sequence, from a results database's rows or with a profile's context
factors (price.py), and the answer (answer.py: `opperf predict`). The hand-written idealised step of
a built-in model (shapes.py, idealised.py) stays as `opperf predict --idealised`. Uses mapping and
replay; neither uses it."""
