"""ReaLModel: the packed decoder-only transformer, its HF I/O and generation."""

from realrl.impl.model.nn.real_model import ReaLModel

__all__ = ["ReaLModel"]
