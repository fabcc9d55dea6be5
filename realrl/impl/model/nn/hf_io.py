"""Hugging Face checkpoint folders <-> ReaLModel, through the family registry (api/from_hf).

A critic is saved as the HF checkpoint of its body plus ``critic_head.safetensors`` and a
``realrl_critic`` marker in config.json, so ``AutoModelForCausalLM`` still loads the body and
``from_pretrained(..., is_critic=True)`` restores the head exactly.
"""

from __future__ import annotations

import glob
import json
import os
import shutil
import uuid
from collections.abc import Mapping
from typing import Any

import torch

import realrl.api.from_hf  # noqa: F401  (registers the families)
from realrl.api.core.dtype_names import dtype_name
from realrl.api.core.hf_family import HFFamily, get_hf_family, hf_family_for_model_type
from realrl.api.core.model_api import ReaLModelConfig
from realrl.base import logging
from realrl.impl.model.nn import lora

logger = logging.getLogger("hf_io")
CRITIC_HEAD_FILE = "critic_head.safetensors"
CRITIC_MARKER = "realrl_critic"
_WEIGHTS_FILE = "model.safetensors"


def infer_hf_model_type(cfg: ReaLModelConfig) -> str:
    """The family a config saves as when it does not say (``cfg.hf_model_type`` is None)."""
    if cfg.hf_model_type:
        return cfg.hf_model_type
    if cfg.n_experts:  # Mixtral unless only a Qwen family can say it
        if cfg.qk_layernorm:
            return "qwen3_moe"
        mixtral = cfg.norm_topk_prob and cfg.moe_layers == list(range(cfg.n_layers))
        if cfg.shared_expert_intermediate_dim or cfg.use_attention_bias or not mixtral:
            return "qwen2_moe"
        return "mixtral"
    if cfg.abs_position_embedding:
        return "gpt2"
    if cfg.qk_layernorm:
        return "qwen3"
    if cfg.use_attention_bias and not cfg.use_attn_proj_bias:
        return "qwen2"
    if cfg.sliding_window:
        return "mistral"
    return "llama"


def family_of(cfg: ReaLModelConfig) -> HFFamily:
    model_type = infer_hf_model_type(cfg)
    try:
        return hf_family_for_model_type(model_type)
    except LookupError:
        return get_hf_family(model_type)


def _weight_files(path: str) -> tuple[list[str], bool]:
    """The weight files of a checkpoint folder and whether they are safetensors (else *.bin)."""
    files = sorted(
        f for f in glob.glob(os.path.join(path, "*.safetensors")) if not f.endswith(CRITIC_HEAD_FILE)
    )
    if files:
        return files, True
    files = sorted(glob.glob(os.path.join(path, "*.bin")))
    if not files:
        raise FileNotFoundError(f"no *.safetensors or *.bin weights in checkpoint folder {path!r}")
    return files, False


def read_hf_state_dict(path: str) -> dict[str, torch.Tensor]:
    """All weights of a checkpoint folder: *.safetensors (sharded or not), else *.bin."""
    files, safe = _weight_files(path)
    sd: dict[str, torch.Tensor] = {}
    if not safe:
        for f in files:
            sd.update(torch.load(f, map_location="cpu", weights_only=True))
        return sd
    from safetensors.torch import load_file

    for f in files:
        sd.update(load_file(f, device="cpu"))
    return sd


class CheckpointReader:
    """A checkpoint folder's tensors, read whole or one slice at a time: safetensors files give
    the bytes of a slice only; *.bin files are read whole, once. ``bytes_read`` counts what was
    taken from the files."""

    def __init__(self, path: str):
        from safetensors import safe_open

        files, safe = _weight_files(path)
        self.bytes_read = 0
        self.loaded: dict[str, torch.Tensor] = {} if safe else read_hf_state_dict(path)
        self.handles = {f: safe_open(f, framework="pt", device="cpu") for f in files} if safe else {}
        self.file_of = {name: f for f, h in self.handles.items() for name in h.keys()}

    def names(self) -> list[str]:
        return list(self.file_of or self.loaded)

    def placeholder(self, name: str) -> torch.Tensor:
        """A meta tensor of the stored shape and dtype (no bytes read)."""
        if self.loaded:
            return self.loaded[name].to("meta")
        sl = self.handles[self.file_of[name]].get_slice(name)
        return torch.empty(sl.get_shape(), dtype=_SAFETENSORS_DTYPES[sl.get_dtype()], device="meta")

    def read(self, name: str, index: tuple[slice, ...] = ()) -> torch.Tensor:
        if self.loaded:
            t = self.loaded[name][index]
        else:
            sl = self.handles[self.file_of[name]].get_slice(name)
            t = sl[index] if index else sl[:]
        self.bytes_read += t.numel() * t.element_size()
        return t


_SAFETENSORS_DTYPES = {
    "F64": torch.float64,
    "F32": torch.float32,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "I64": torch.int64,
    "I32": torch.int32,
    "I16": torch.int16,
    "I8": torch.int8,
    "U8": torch.uint8,
    "BOOL": torch.bool,
}


def _read_config(path: str, is_critic: bool) -> tuple[ReaLModelConfig, HFFamily, dict]:
    """The checkpoint's architecture from its config.json, read by its family (no transformers)."""
    cfg_file = os.path.join(path, "config.json")
    if not os.path.isfile(cfg_file):
        raise FileNotFoundError(f"{path!r} is not a Hugging Face checkpoint folder (no config.json)")
    with open(cfg_file) as f:
        raw = json.load(f)
    if CRITIC_MARKER in raw and not is_critic:
        raise ValueError(f"{path!r} holds a critic (scalar head); load it with is_critic=True")
    if "model_type" not in raw:
        raise ValueError(f"{cfg_file} names no model_type")
    family = hf_family_for_model_type(raw["model_type"])
    cfg = family.config_from_hf(raw)
    cfg.is_critic = is_critic
    return cfg, family, raw


def _saved_head(path: str, raw: dict) -> dict[str, torch.Tensor]:
    """A saved critic's scalar head, as ``head.*`` entries (empty for an LM checkpoint)."""
    if CRITIC_MARKER not in raw:
        return {}
    from safetensors.torch import load_file

    head = load_file(os.path.join(path, raw[CRITIC_MARKER].get("head_file", CRITIC_HEAD_FILE)))
    return {f"head.{k}": v for k, v in head.items()}


def _check_loaded(
    path: str, family: HFFamily, cfg: ReaLModelConfig, saved_critic: bool, missing, unexpected
) -> None:
    allowed = {"head.weight", "head.bias"} if (cfg.is_critic and not saved_critic) else set()
    if cfg.tied_embedding and not cfg.is_critic:
        allowed.add("head.weight")
    missing = sorted(set(missing) - allowed)
    if missing or unexpected:
        raise ValueError(
            f"checkpoint {path!r} does not fit {family.name}: missing {missing}, unexpected {unexpected}"
        )


def load_pretrained(
    cls,
    path: str,
    is_critic: bool,
    dtype: torch.dtype | None,
    attn_impl: str,
    device: torch.device | str | None,
    critic_head_init: str,
    tp_mesh=None,
    expert_parallel: bool = False,
    cut=None,
):
    """``tp_mesh``: split the model over it as it loads, each rank reading only its slices
    (``expert_parallel``: of a Mixture-of-Experts model, only its own whole experts). ``cut``: a
    function from the whole model to the part this rank holds (a pipeline stage), applied before
    anything is allocated, so only that part's tensors are read."""
    cfg, family, raw = _read_config(path, is_critic)
    if (tp_mesh is not None and tp_mesh.size() > 1) or cut is not None:
        return _load_split(
            cls,
            path,
            cfg,
            family,
            raw,
            dtype,
            attn_impl,
            critic_head_init,
            tp_mesh,
            expert_parallel,
            cut,
            device,
        )
    sd = family.sd_from_hf(read_hf_state_dict(path), cfg)
    sd.update(_saved_head(path, raw))
    model = cls(
        cfg,
        dtype=dtype or torch.float32,
        device=device,
        attn_impl=attn_impl,
        critic_head_init=critic_head_init,
    )
    missing, unexpected = model.load_state_dict(sd, strict=False)
    _check_loaded(path, family, cfg, CRITIC_MARKER in raw, missing, unexpected)
    return model


def _sources(reader: CheckpointReader, family: HFFamily, cfg: ReaLModelConfig) -> dict[str, object]:
    """ReaL parameter name -> the checkpoint tensor it is (a name: read it slice by slice), or its
    value (a whole tensor: the family transforms it, e.g. gpt2's fused, transposed projections).

    Found by running the family's conversion on meta placeholders: an output that *is* an input is
    a renamed tensor; the others are computed from the real tensors the renames did not take."""
    placeholders = {name: reader.placeholder(name) for name in reader.names()}
    converted = family.sd_from_hf(dict(placeholders), cfg)
    by_id = {id(t): name for name, t in placeholders.items()}
    sources: dict[str, object] = {k: by_id[id(v)] for k, v in converted.items() if id(v) in by_id}
    if len(sources) < len(converted):
        renamed = set(sources.values())
        mixed = {n: (t if n in renamed else reader.read(n)) for n, t in placeholders.items()}
        for k, v in family.sd_from_hf(mixed, cfg).items():
            if k not in sources:
                if v.is_meta:
                    raise ValueError(f"{family.name}: cannot tell which checkpoint tensors make {k!r}")
                sources[k] = v
    return sources


def _local_index(param: torch.Tensor) -> tuple[slice, ...]:
    """The slice of the whole tensor this rank's shard of ``param`` holds ((): all of it)."""
    from realrl.impl.model.parallel.dtensor import is_dtensor

    if not is_dtensor(param):
        return ()
    index = [slice(None)] * param.dim()
    for mesh_dim, placement in enumerate(param.placements):
        if placement.is_shard():
            d, n = placement.dim, param.device_mesh.size(mesh_dim)
            size = param.shape[d] // n
            rank = param.device_mesh.get_local_rank(mesh_dim)
            index[d] = slice(rank * size, (rank + 1) * size)
    return tuple(index)


@torch.no_grad()
def _load_split(
    cls, path, cfg, family, raw, dtype, attn_impl, critic_head_init, tp_mesh, expert_parallel, cut, device
):
    """Build on "meta", cut this rank's part (``cut``), split it over ``tp_mesh``, allocate this
    rank's shards on the mesh's device (else ``device``) and fill them from the checkpoint, reading
    each renamed tensor's slice only (and, with ``expert_parallel``, no tensor of another rank's
    experts; with ``cut``, no tensor of another part)."""
    from realrl.impl.model.parallel.dtensor import local
    from realrl.impl.model.parallel.tensor_parallel import apply_tensor_parallel, expert_owner

    model = cls(
        cfg,
        dtype=dtype or torch.float32,
        device="meta",
        attn_impl=attn_impl,
        critic_head_init=critic_head_init,
    )
    whole_names = {name for name, _ in model.named_parameters()} | {"head.weight"}
    if cut is not None:
        model = cut(model)
    split = tp_mesh is not None and tp_mesh.size() > 1
    if split:  # allocated where the mesh is
        apply_tensor_parallel(model, tp_mesh, expert_parallel)
        on_cpu = tp_mesh.device_type == "cpu"
        target = torch.device("cpu") if on_cpu else torch.device("cuda", torch.cuda.current_device())
    else:
        target = torch.device(device or "cpu")
    model.materialize(target)
    reader = CheckpointReader(path)
    sources = _sources(reader, family, cfg)
    sources.update(_saved_head(path, raw))
    tied_source = sources.get("embed.wte.weight") if cfg.tied_embedding and not cfg.is_critic else None
    missing = []
    for name, param in model.named_parameters():
        index, source = _local_index(param), sources.pop(name, None)
        if source is None and name == "head.weight":  # a last pipeline stage's copy of a tied embedding
            source = tied_source
        if source is None:
            missing.append(name)
            continue
        value = reader.read(source, index) if isinstance(source, str) else source[index]
        local(param).copy_(value)
    rank, tp = (tp_mesh.get_local_rank(), tp_mesh.size()) if split else (0, 1)
    held_elsewhere = {
        k for k in sources if expert_parallel and expert_owner(k, cfg.n_experts, tp) not in (None, rank)
    }
    # a whole model's parameter left over is another stage's (or, tied, the head the embedding is)
    unexpected = sorted(k for k in sources if k not in held_elsewhere and k not in whole_names)
    _check_loaded(path, family, cfg, CRITIC_MARKER in raw, missing, unexpected)
    if cfg.is_critic and CRITIC_MARKER not in raw:
        model.reset_critic_head()
    model.checkpoint_bytes_read = reader.bytes_read
    return model


def _swap_into_place(tmp: str, save_dir: str) -> None:
    """Replace ``save_dir`` by ``tmp`` with renames only: a reader never sees a half-written folder."""
    if not os.path.exists(save_dir):
        os.rename(tmp, save_dir)
        return
    old = f"{save_dir}.old-{uuid.uuid4().hex[:8]}"
    os.rename(save_dir, old)
    os.rename(tmp, save_dir)
    shutil.rmtree(old, ignore_errors=True)


def _write_hf_config(hf_cfg: Any, folder: str, dtype: torch.dtype) -> None:
    """``folder/config.json`` from what the family's ``config_to_hf`` gave: a dict (realrl's
    families: written as it is, no transformers needed) or a transformers config (a plugin's)."""
    if isinstance(hf_cfg, Mapping):
        with open(os.path.join(folder, "config.json"), "w") as f:
            json.dump({**hf_cfg, "dtype": dtype_name(dtype)}, f, indent=2, sort_keys=True)
        return
    hf_cfg.dtype = dtype
    hf_cfg.save_pretrained(folder)


def save_pretrained(
    model, save_dir: str, tokenizer: Any = None, state_dict: dict[str, torch.Tensor] | None = None
) -> None:
    from safetensors.torch import save_file

    cfg: ReaLModelConfig = model.config
    family = family_of(cfg)
    hf_cfg = family.config_to_hf(cfg)
    source = model.state_dict() if state_dict is None else state_dict
    sd = {k: v.detach().cpu().contiguous() for k, v in source.items()}
    adapted = sd if model.lora is not None else None
    if adapted is not None:  # the merged model here, the adapters alone under adapter/
        sd = lora.merged_state_dict(adapted, model.lora)
    head = {k[len("head.") :]: sd.pop(k) for k in list(sd) if k.startswith("head.")} if cfg.is_critic else {}
    hf_sd = family.sd_to_hf(sd, cfg)

    save_dir = os.path.abspath(save_dir.rstrip("/"))
    os.makedirs(os.path.dirname(save_dir), exist_ok=True)
    tmp = f"{save_dir}.tmp-{uuid.uuid4().hex[:8]}"
    os.makedirs(tmp)
    try:
        _write_hf_config(hf_cfg, tmp, model.dtype)
        save_file(hf_sd, os.path.join(tmp, _WEIGHTS_FILE), metadata={"format": "pt"})
        if cfg.is_critic:
            save_file(head, os.path.join(tmp, CRITIC_HEAD_FILE), metadata={"format": "pt"})
            with open(os.path.join(tmp, "config.json")) as f:
                raw = json.load(f)
            raw[CRITIC_MARKER] = {"head_file": CRITIC_HEAD_FILE}
            with open(os.path.join(tmp, "config.json"), "w") as f:
                json.dump(raw, f, indent=2, sort_keys=True)
        if tokenizer is not None:
            tokenizer.save_pretrained(tmp)
        if adapted is not None:
            try:
                lora.save_adapter_folder(
                    adapted,
                    model.lora,
                    lambda part: family.sd_to_hf(part, cfg),
                    os.path.join(tmp, lora.ADAPTER_DIR),
                    model.base_path,
                    cfg.is_critic,
                )
            except lora.NoAdapterFolder as e:
                logger.warning("%s: the merged model only, no %s/ folder: %s", save_dir, lora.ADAPTER_DIR, e)
        _swap_into_place(tmp, save_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
