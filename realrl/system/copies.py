"""Which copies of each model the workers hold, as the master posts calls.

A model's weights live at its home (the placement of its training call). A call placed elsewhere
runs on a copy in its own layout, moved there from home just before it (parameter
reallocation, ReaL: "Efficient RLHF Training of Large Language Models with Parameter
Reallocation"). A worker runs its requests in the order the master posts them, so what the
master records at posting time is exactly what each worker will hold when it reaches the call:
a copy is current when no training call of its model was posted since it was filled.

Weight pushes (asynchronous RL, copies on workers of their own; over NCCL on GPUs, gloo on CPUs):
after each training call, its workers post the sends of the new weights to the generation copy at
once and go on; the copy's next call receives every version pushed since its last (the newest
lands last). A training worker then never waits for a busy generation worker, nor the reverse.
The copy's first fill is an ordinary reallocation, which also creates the group's communicator
the pushes then use.
"""

from __future__ import annotations

import dataclasses

from realrl.api.core.dfg import MFCDef, ModelInterfaceType
from realrl.api.core.layout import Placement
from realrl.api.core.system_api import ExperimentConfig, copy_name
from realrl.system.protocol import ReallocOrder
from realrl.system.transfer_plan import TagCounter
from realrl.system.version_rule import VersionRule


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
    version: int = 0  # the model version the copy holds for the call (training steps behind it)
    receives: tuple[ReallocOrder, ...] = ()  # weight pushes the copy takes first, oldest first


class CopyTracker:
    """Also the master's record of which model version each call runs on (``versions_used``):
    the version a generate call samples from is its samples' ``behav_version``, and the
    difference to the version that trains on them their staleness (asynchronous RL)."""

    def __init__(self, config: ExperimentConfig, tags: TagCounter):
        self.config = config
        self.rule = VersionRule(config)  # whether copies are kept and pushed to (asynchronous RL)
        self.tags = tags  # the dispatcher's: a push's messages need tags unique among live ones
        self.versions = dict.fromkeys(config.allocations, 0)  # training calls posted per model
        self.filled: dict[str, int] = {}  # live copy -> the version it was filled at
        self.versions_used: dict[tuple[str, int], int] = {}  # (mfc, step) -> the version it ran on
        self.pushed: dict[str, list[ReallocOrder]] = {}  # copy -> pushes it has not received yet

    def start_at(self, version: int) -> None:
        """A resumed run: every model has trained ``version`` steps, and no copy is filled yet."""
        self.versions = dict.fromkeys(self.versions, version)

    def push_placements(self, role: str) -> list[Placement]:
        """The generation copies of ``role`` its training calls push to: under asynchronous RL, on
        workers apart from home (a worker on both sides would wait for its own receive); on any
        device."""
        cfg = self.config
        if not self.rule.pushes_weights():
            return []
        home, out = cfg.placement(role), []
        for m in cfg.mfcs:
            p = cfg.call_placement(m.name)
            if m.role == role and m.interface_type is ModelInterfaceType.GENERATE and p not in out:
                if not set(p.workers) & set(home.workers):
                    out.append(p)
        return out

    def weight_pushes(self, mfc: MFCDef, total_steps: int) -> list[ReallocOrder]:
        """The pushes the training call ``mfc`` sends once done (after ``plan`` counted it): one
        per push copy, when a generate call will sample from the version it makes (version v
        serves the call of step v + max_staleness), none otherwise. Every push is received by
        the copy's next call (``plan``)."""
        cfg, role = self.config, mfc.role
        if mfc.interface_type is not ModelInterfaceType.TRAIN_STEP:
            return []
        version = self.versions[role]
        if not self.rule.serves_a_call(version, total_steps):
            return []
        orders = []
        for placement in self.push_placements(role):
            adapters_only = cfg.models[role].lora_rank > 0  # the first fill, a reallocation, brought the base
            order = ReallocOrder(role, cfg.placement(role), placement, self.tags.next, adapters_only, version)
            self.tags.take(order.n_tags)
            self.pushed.setdefault(copy_name(role, placement), []).append(order)
            orders.append(order)
        return orders

    def _receive(self, name: str, up_to: int) -> tuple[ReallocOrder, ...]:
        """The pushes to copy ``name`` of versions up to ``up_to``, taken out of the record; the
        copy holds the newest of them once received."""
        waiting = self.pushed.get(name, [])
        taken = tuple(o for o in waiting if o.version <= up_to)
        self.pushed[name] = [o for o in waiting if o.version > up_to]
        if taken:
            self.filled[name] = taken[-1].version
        return taken

    def plan(self, mfc: MFCDef, step: int | None = None) -> CopyPlan | None:
        """Record that ``mfc`` is being posted now (for training step ``step``; None for a call
        outside the steps, an evaluation's, whose version is not recorded); None when it runs at
        its model's home. Under asynchronous RL a generate call's copy is kept between calls."""
        cfg, role = self.config, mfc.role
        home, placement = cfg.placement(role), cfg.call_placement(mfc.name)
        if placement == home:
            if mfc.interface_type is ModelInterfaceType.TRAIN_STEP:
                self.versions[role] += 1
            elif step is not None:
                self.versions_used[(mfc.name, step)] = self.versions[role]
            return None
        name = copy_name(role, placement)
        receives = self._receive(name, self.versions[role]) if name in self.filled else ()
        filled = self.filled.get(name)
        ahead = self.rule.keeps_copy(mfc)
        # under asynchronous RL the master posts a generate call of step k when exactly
        # k - max_staleness training calls of its model are posted (VersionRule.ready): the copy
        # then holds, or is refilled to, exactly that version
        realloc = filled != self.versions[role]
        version = self.versions[role] if realloc else filled
        adapters_only = filled is not None and cfg.models[role].lora_rank > 0
        keep = cfg.models[role].keep_gen_copy or ahead
        if keep:
            self.filled[name] = version
        else:
            self.filled.pop(name, None)
        if step is not None:
            self.versions_used[(mfc.name, step)] = version
        return CopyPlan(
            role,
            home,
            placement,
            name,
            realloc,
            drop=not keep,
            adapters_only=adapters_only,
            version=version,
            receives=receives,
        )

    def plan_continue(self, mfc: MFCDef, finished: int) -> CopyPlan | None:
        """The next piece of ``mfc``'s generate call decoded in pieces (partial rollouts): its
        copy is refilled when its model has finished a newer version than the copy holds and no
        training call of that model is still running (``finished``: the model's training steps
        done), so the refill never waits behind training. None at home, whose weights are
        already the newest the worker has run."""
        cfg, role = self.config, mfc.role
        home, placement = cfg.placement(role), cfg.call_placement(mfc.name)
        if placement == home:
            return None
        name = copy_name(role, placement)
        receives = self._receive(name, finished)  # pushed versions whose training is done
        # with pushes the newest finished version comes pushed (above), or later
        realloc = not self.push_placements(role) and self.filled[name] < self.versions[role] == finished
        if realloc:
            self.filled[name] = self.versions[role]
        adapters_only = cfg.models[role].lora_rank > 0
        return CopyPlan(
            role,
            home,
            placement,
            name,
            realloc,
            drop=False,
            adapters_only=adapters_only,
            version=self.filled[name],
            receives=receives,
        )
