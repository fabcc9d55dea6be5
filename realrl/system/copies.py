"""Which copies of each model the workers hold, as the master posts calls.

A model's weights live at its home (the placement of its training call). A call placed elsewhere
runs on a copy in its own layout, moved there from home just before it (parameter
reallocation, ReaL: "Efficient RLHF Training of Large Language Models with Parameter
Reallocation"). A worker runs its requests in the order the master posts them, so what the
master records at posting time is exactly what each worker will hold when it reaches the call:
a copy is current when no training call of its model was posted since it was filled.
"""

from __future__ import annotations

import dataclasses

from realrl.api.core.dfg import MFCDef, ModelInterfaceType
from realrl.api.core.layout import Placement
from realrl.api.core.system_api import ExperimentConfig, copy_name


@dataclasses.dataclass(frozen=True)
class CopyPlan:
    """How one call uses a copy: ``realloc``: fill it from home first; ``drop``: free it after;
    ``adapters_only``: the copy already holds the base (a LoRA model's frozen weights), so the
    fill moves only what trains."""

    role: str
    home: Placement
    placement: Placement
    name: str
    realloc: bool
    drop: bool
    adapters_only: bool = False


class CopyTracker:
    def __init__(self, config: ExperimentConfig):
        self.config = config
        self.versions = dict.fromkeys(config.allocations, 0)  # training calls posted per model
        self.filled: dict[str, int] = {}  # live copy -> the version it was filled at

    def plan(self, mfc: MFCDef) -> CopyPlan | None:
        """Record that ``mfc`` is being posted now; None when it runs at its model's home."""
        cfg, role = self.config, mfc.role
        home, placement = cfg.placement(role), cfg.call_placement(mfc.name)
        if placement == home:
            if mfc.interface_type is ModelInterfaceType.TRAIN_STEP:
                self.versions[role] += 1
            return None
        name = copy_name(role, placement)
        realloc = self.filled.get(name) != self.versions[role]
        adapters_only = name in self.filled and cfg.models[role].lora_rank > 0
        keep = cfg.models[role].keep_gen_copy
        if keep:
            self.filled[name] = self.versions[role]
        else:
            self.filled.pop(name, None)
        return CopyPlan(role, home, placement, name, realloc, drop=not keep, adapters_only=adapters_only)
