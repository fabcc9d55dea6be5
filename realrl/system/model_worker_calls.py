"""A model worker's ``mfc`` requests: receive or reallocate weights, move the inputs' tensors in
from other workers, run the call on its model (whole, in pieces, or on a copy), keep its outputs
in the store and push them on to the workers that read them; the reply carries metadata and stats.
"""

from __future__ import annotations

import contextlib
import time
import zlib

import torch

from realrl.api.core import model_api
from realrl.api.core.data_api import SequenceSample
from realrl.api.core.dfg import MFCDef, ModelInterfaceType
from realrl.api.core.model_api import DROPPED_KEY, SAMPLES_KEY
from realrl.api.core.system_api import ModelWorkerConfig
from realrl.base import logging, seeding
from realrl.base.failpoints import Failpoints
from realrl.base.peak_memory import process_peaks
from realrl.impl.model.nn.lora import adapters_disabled
from realrl.system.data_transfer import PendingSends, TensorStore, push_outputs, run_transfers
from realrl.system.model_worker_setup import HeldModels
from realrl.system.protocol import MFCCall, MFCReply, MFCRequest, ReallocOrder

logger = logging.getLogger("model_worker")

_FAILPOINT = {
    ModelInterfaceType.GENERATE: "generate",
    ModelInterfaceType.INFERENCE: "inference",
    ModelInterfaceType.TRAIN_STEP: "train",
}


class MFCRunner:
    """Runs the master's model function calls on the models in ``held``, reading inputs from and
    keeping outputs in ``store``; ``sends`` holds the sends it posted and did not wait for."""

    def __init__(
        self,
        name: str,
        config: ModelWorkerConfig,
        failpoints: Failpoints,
        held: HeldModels,
        store: TensorStore,
        sends: PendingSends,
    ):
        self.name, self.config, self.failpoints = name, config, failpoints
        self.held, self.store, self.sends = held, store, sends
        # generate calls decoded in pieces (partial rollouts), paused between pieces: (mfc, step) ->
        self.rollouts: dict[tuple[str, int], tuple[model_api.Rollout, list]] = {}

    def run(self, req: MFCRequest) -> MFCReply:
        tik = time.monotonic()
        reply = self._run(req)
        reply.seconds = time.monotonic() - tik
        reply.peak_memory = process_peaks()
        return reply

    def _run(self, req: MFCRequest) -> MFCReply:
        moves = [self._receive_weights(order) for order in req.weight_receives]
        # the pushes' own figure: the seconds receiving them blocked this worker
        received = _sum_moves([{"recv_blocked_s": m.pop("recv_blocked_s")} for m in moves])
        if req.realloc is not None:
            moves.append(self._reallocate(req))
        realloc = _sum_moves(moves)
        if req.pieces:
            self.failpoints.hit("transfer", None if req.call is None else req.call.step)
        self.sends.reap()
        run_transfers(self.store, req.pieces, self.config.worker_index, self.config.timeouts.peer, self.sends)
        call = req.call
        if call is None:
            return MFCReply(realloc=realloc, pushed=received)
        try:
            reply = self._call(call)
        finally:
            if call.drop_copy:
                self.held.copies.drop(call.copy)
        reply.realloc = realloc
        reply.pushed = _sum_moves([m for m in (reply.pushed, received) if m])
        return reply

    def _receive_weights(self, order: ReallocOrder) -> dict[str, float]:
        logger.info("%s receiving pushed weights of %s (version %d)", self.name, order.role, order.version)
        self.failpoints.hit("realloc")
        return self.held.copies.receive_weights(order, self.held.tokenizer)

    def _reallocate(self, req: MFCRequest) -> dict[str, float]:
        order = req.realloc
        home = self.held.models.get(order.role) if self.config.worker_index in order.src.workers else None
        tokenizer = home.tokenizer if home is not None else self.held.tokenizer
        logger.info("%s reallocating %s: %s -> %s", self.name, order.role, order.src, order.dst)
        self.failpoints.hit("realloc")
        return self.held.copies.reallocate(order, home, tokenizer)

    def _call(self, call: MFCCall) -> MFCReply:
        mfc = self.held.mfcs[call.mfc]
        model = self.held.models[mfc.role] if call.copy is None else self.held.copies[call.copy]
        # the store holds host tensors; the call sees its inputs on its model's device
        later_piece = call.segment is not None and call.segment.index > 0  # the rollout holds the inputs
        data = None if later_piece else self.store.assemble(call.input_meta).to(model.device)
        if mfc.input_key_remap and data is not None:
            data.remap_keys_(mfc.input_key_remap)
        interface = self.held.interfaces[mfc.name]
        # Every call draws from its own stream, so results do not depend on how calls of
        # different models interleave on this worker (same seed, same numbers, any launcher).
        # A generate call's stream is the same on every dp rank: each sequence samples with
        # noise keyed by its sample id, so the tokens do not depend on how the batch is split.
        self.failpoints.hit(_FAILPOINT.get(mfc.interface_type, ""), call.step)
        generates = mfc.interface_type is ModelInterfaceType.GENERATE
        seeding.set_random_seed(
            (self.config.seed * 1_000_003 + zlib.crc32(mfc.name.encode()) + call.step) % 2**31,
            0 if generates else call.dp_rank,
        )
        if mfc.interface_type is ModelInterfaceType.TRAIN_STEP:
            # the interface advances model.version (PPO may step the optimizer several times)
            stats = interface.train_step(model, data, mfc.mb_spec)
            pushed = []
            for order in call.push_weights:  # the new weights leave for the generation copies now
                sends, figures = self.held.copies.send_weights(order, model)
                for work, buf, peer in sends:
                    self.sends.add(work, buf, f"{mfc.role} version {order.version}", peer)
                pushed.append(figures)
            return MFCReply(stats=float_stats(stats, mfc.name), pushed=_sum_moves(pushed))
        if mfc.interface_type is ModelInterfaceType.GENERATE and call.segment is not None:
            return self._generate_piece(mfc, call, model, data)
        if mfc.interface_type is ModelInterfaceType.GENERATE:
            out = interface.generate(model, data, mfc.mb_spec)
        elif mfc.interface_type is ModelInterfaceType.INFERENCE:
            with adapters_disabled(model.module.module) if mfc.base_weights else contextlib.nullcontext():
                out = interface.inference(model, data, mfc.mb_spec)
        else:
            raise ValueError(
                f"MFC {mfc.name!r}: the runtime does not schedule {mfc.interface_type.value} calls"
            )
        return self._reply(mfc, data, out, call.pushes)

    def _generate_piece(
        self, mfc: MFCDef, call: MFCCall, model: model_api.Model, data: SequenceSample | None
    ) -> MFCReply:
        """One piece of a generate call decoded in pieces (partial rollouts): piece 0 starts the
        rollout, every piece advances it with the weights the model holds now (their version the
        model's), and the piece that finishes this dp rank's answers replies with the outputs;
        a rank done earlier answers the later pieces with nothing."""
        key = (mfc.name, call.step)
        if call.segment.index == 0:
            rollout = self.held.interfaces[mfc.name].start_rollout(model, data, mfc.mb_spec)
            self.rollouts[key] = (rollout, call.pushes)  # the pushes go once the answers are done
        if key not in self.rollouts:
            return MFCReply()
        rollout, pushes = self.rollouts[key]
        left = rollout.advance(call.segment.tokens, model.version.global_step)
        if left:
            return MFCReply(unfinished=left)
        del self.rollouts[key]
        return self._reply(mfc, rollout.data, rollout.finish(), pushes)

    def _reply(self, mfc: MFCDef, data: SequenceSample, out, pushes: list) -> MFCReply:
        """A generate or inference call's reply: its outputs kept in the store (and pushed to the
        workers that read them), its statistics."""
        stats, samples, dropped = None, None, None
        if isinstance(out, tuple):  # (outputs, statistics of the call): both are reported
            out, stats = out
            stats = dict(stats)
            samples = stats.pop(SAMPLES_KEY, None)
            dropped = stats.pop(DROPPED_KEY, None)
            stats = float_stats(stats, mfc.name)
        meta = self._keep_outputs(mfc, data, out)
        push_outputs(self.store, pushes, self.sends)
        return MFCReply(meta=meta, stats=stats, samples=samples, dropped=dropped)

    def _keep_outputs(
        self, mfc: MFCDef, data: SequenceSample, out: SequenceSample | None
    ) -> SequenceSample | None:
        if not mfc.output_keys:
            return None
        if not isinstance(out, SequenceSample):
            raise TypeError(
                f"MFC {mfc.name!r}: the interface returned {type(out).__name__}, not a SequenceSample"
            )
        if mfc.output_key_remap:
            out.remap_keys_({k: v for k, v in mfc.output_key_remap.items() if k in out.keys})
        missing = set(mfc.output_keys) - out.keys
        if missing:
            raise ValueError(
                f"MFC {mfc.name!r}: the interface did not produce keys {sorted(missing)} (it produced {sorted(out.keys)})"
            )
        if out.ids != data.ids:
            raise ValueError(
                f"MFC {mfc.name!r}: the output ids {out.ids[:4]}... differ from the input ids {data.ids[:4]}..."
            )
        out = out.select(mfc.output_keys)
        self.store.put(out)
        return out.meta()


def _sum_moves(moves: list[dict[str, float]]) -> dict[str, float] | None:
    """One report of a call's weight moves (pushed versions received, a reallocation; or the
    figures of its pushes): each figure summed."""
    if not moves:
        return None
    return {k: sum(m.get(k, 0.0) for m in moves) for k in dict.fromkeys(k for m in moves for k in m)}


def float_stats(stats, mfc_name: str) -> dict[str, float]:
    if stats is None:
        return {}
    if not isinstance(stats, dict):
        raise TypeError(
            f"MFC {mfc_name!r}: the interface returned stats of type {type(stats).__name__}, expected a dict"
        )
    out = {}
    for k, v in stats.items():
        if isinstance(v, torch.Tensor):
            v = v.item()
        out[str(k)] = float(v)
    return out
