"""Prediction. In: a model's configuration (models.py: data/models/*.yaml or a config.json) and a
results database. Out: the calls of its layers at a configuration (shapes.py) and a step's time,
priced with replay's lookup (idealised.py). Uses replay; replay never uses it."""
