"""Models: ReaLModel, attention backends, engines. Importing this registers the HF families
(api/from_hf) and the model factories "real_model" and "null"."""

import realrl.api.from_hf  # noqa: F401  (registers the HF families)
from realrl.impl.model.nn import factory  # noqa: F401  (registers "real_model" and "null")
