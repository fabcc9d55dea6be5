"""Models: ReaLModel, attention backends, engines. ``realrl.impl.builtin`` registers the HF
families (api/from_hf) and the model factories "real_model" and "null"."""
