"""DeepSpeed-Chat's RLHF data preparation: source adapters, phase split, blending (re-exported
here, without torch: the command line splits the embedded task's data), and the phase formats
(``phases``) and the "dschat" dataset (``dataset``, registered by ``realrl.impl.builtin``)."""

from realrl.impl.dataset.dschat.adapters import adapter_names, get_raw_dataset
from realrl.impl.dataset.dschat.base import PromptRawDataset, load_local_copy
from realrl.impl.dataset.dschat.blend import blend_counts, blend_indices
from realrl.impl.dataset.dschat.split import all_phase_indices, parse_split, phase_indices, split_bounds

__all__ = [
    "PromptRawDataset",
    "adapter_names",
    "all_phase_indices",
    "blend_counts",
    "blend_indices",
    "get_raw_dataset",
    "load_local_copy",
    "parse_split",
    "phase_indices",
    "split_bounds",
]
