"""A model worker's recover-point requests: save a model (Hugging Face folder or recover point) or
an interface's state, load them back, and save or load the samples of its store."""

from __future__ import annotations

from realrl.api.core.data_api import SequenceSample
from realrl.base import logging
from realrl.base.failpoints import Failpoints
from realrl.system import recover_state
from realrl.system.data_transfer import TensorStore
from realrl.system.model_worker_setup import HeldModels
from realrl.system.protocol import LoadRecoverRequest, SamplesRequest, SaveRequest

logger = logging.getLogger("model_worker")


class CheckpointHandlers:
    """The ``save``, ``load_recover`` and ``samples`` requests, on the models in ``held`` and the
    samples in ``store``."""

    def __init__(self, name: str, failpoints: Failpoints, held: HeldModels, store: TensorStore):
        self.name, self.failpoints, self.held, self.store = name, failpoints, held, store

    def save(self, req: SaveRequest) -> None:
        self.failpoints.hit("save")
        held = self.held
        if req.kind == "state":  # a frozen role's call may run away from the model's home
            recover_state.save_interface_state(held.interfaces[req.interface], req.path, req.role, req.step)
            logger.info("%s saved the state of %s to %s", self.name, req.interface, req.path)
            return
        model = held.models[req.role]
        if req.kind == "hf":
            engine_parallel = getattr(model.module, "parallel", None)
            collective = engine_parallel is not None and engine_parallel.sharded
            if not collective and held.parallel[req.role].model_rank != 0:
                return  # a whole replica: its first rank writes it
            held.interfaces[req.interface].save(model, req.path)
        elif req.kind == "recover":
            recover_state.save_recover(model, req.role, held.role_interfaces(req.role), req.path, req.step)
        else:
            raise ValueError(f"unknown checkpoint kind {req.kind!r}")
        logger.info("%s saved %s (%s) to %s", self.name, req.role, req.kind, req.path)

    def samples(self, req: SamplesRequest) -> SequenceSample | None:
        """Save samples of the store to a recover point, or load them back (``SamplesRequest``)."""
        if req.meta is not None:
            recover_state.save_samples(self.store.assemble(req.meta), req.path, req.step)
            return None
        sample = recover_state.load_samples(req.path, req.step)
        self.store.put(sample)
        return sample.meta()

    def load_recover(self, req: LoadRecoverRequest) -> None:
        held = self.held
        for role, path in sorted(req.paths.items()):
            if role in held.models:
                interfaces = held.role_interfaces(role)
                recover_state.load_recover(held.models[role], role, interfaces, path, req.step)
                logger.info("%s restored %s from %s", self.name, role, path)
        for mfc, path in sorted(req.states.items()):
            role = held.mfcs[mfc].role
            recover_state.load_interface_state(held.interfaces[mfc], path, role, req.step)
            logger.info("%s restored the state of %s from %s", self.name, mfc, path)
