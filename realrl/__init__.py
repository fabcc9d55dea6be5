"""realrl: dataflow-graph RLHF over packed, variable-length batches."""

__version__ = "0.1.0"
