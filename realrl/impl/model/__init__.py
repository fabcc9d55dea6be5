"""Models: ReaLModel, attention backends, engines. Importing this registers the model factories."""

from realrl.impl.model.nn import factory  # noqa: F401  (registers "real_model" and "null")
