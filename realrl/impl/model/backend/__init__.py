"""Train and inference engines, registered as the "train", "inference" and "null" backends."""

from realrl.impl.model.backend import backends  # noqa: F401  (registers the backends)
from realrl.impl.model.backend.config import EngineConfig, OptimizerConfig
from realrl.impl.model.backend.engine import InferenceEngine
from realrl.impl.model.backend.train_engine import TrainEngine

__all__ = ["EngineConfig", "InferenceEngine", "OptimizerConfig", "TrainEngine"]
