"""Scalars and text in TensorBoard's event files, written with the ``tensorboard`` package alone.

The master writes them and must not import torch, so this is not ``torch.utils.tensorboard``;
it uses the same pieces that writer is built on (tensorboard's ``EventFileWriter`` and its
protobuf messages), so TensorBoard reads the files exactly as before.
"""

from __future__ import annotations

import time

from tensorboard.compat.proto.event_pb2 import Event
from tensorboard.compat.proto.summary_pb2 import Summary, SummaryMetadata
from tensorboard.compat.proto.tensor_pb2 import TensorProto
from tensorboard.compat.proto.tensor_shape_pb2 import TensorShapeProto
from tensorboard.plugins.text import metadata as text_metadata
from tensorboard.summary.writer.event_file_writer import EventFileWriter


class EventWriter:
    """One event file under ``logdir``; ``add_scalar`` and ``add_text`` as torch's writer has them."""

    def __init__(self, logdir: str):
        self._writer = EventFileWriter(logdir)

    def _add(self, step: int, value: Summary.Value) -> None:
        self._writer.add_event(Event(wall_time=time.time(), step=step, summary=Summary(value=[value])))

    def add_scalar(self, tag: str, value: float, step: int) -> None:
        self._add(step, Summary.Value(tag=tag, simple_value=float(value)))

    def add_text(self, tag: str, text: str, step: int) -> None:
        """Markdown shown by TensorBoard's text plugin (under ``<tag>/text_summary``, as torch names it)."""
        meta: SummaryMetadata = text_metadata.create_summary_metadata(display_name=tag, description="")
        tensor = TensorProto(
            dtype="DT_STRING",
            string_val=[text.encode("utf-8")],
            tensor_shape=TensorShapeProto(dim=[TensorShapeProto.Dim(size=1)]),
        )
        self._add(step, Summary.Value(tag=f"{tag}/text_summary", metadata=meta, tensor=tensor))

    def flush(self) -> None:
        self._writer.flush()

    def close(self) -> None:
        self._writer.close()
