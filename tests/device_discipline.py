"""A device-discipline check for CPU machines: host and "device" tensors must never meet.

On a GPU a tensor on ``cuda`` combined with a multi-element tensor in host memory raises; on the
CPU both live in host memory and nothing complains, so a run that mixes them passes every CPU
test and crashes at its first step on a GPU. This check brings the GPU's rule to the CPU:

- the run's device is spelled ``cpu:0`` (torch moves to ``torch.device("cpu", 0)`` with a copy,
  so a move to the compute device can be told from a move to the host, ``cpu`` / ``.cpu()``);
- a ``TorchFunctionMode`` tags every tensor: *device* (moved or created on ``cpu:0``, computed
  from a device tensor, or a module's parameter), *host* (created without a device, moved to
  ``cpu``, computed from host tensors only) or unknown (made outside torch functions, such as
  gradients, which are never checked);
- torch.distributed (FSDP2, DTensor) allocates on its mesh's device, the compute device, which a
  CPU mesh spells ``cpu``: within torch.distributed ``cpu`` counts as the device, and FSDP is
  told that a host tensor lives elsewhere (``cpu:1``), so it moves it to its device as it would
  on a GPU;
- a device tensor's ``.device`` is ``cpu:0`` (to all but torch's own code), so code that creates
  tensors "where this one lives" creates device tensors, as it would on a GPU;
- an operation that combines a device tensor with a host tensor of more than one element raises
  ``DeviceMixError`` naming the operation and both shapes, exactly where CUDA would refuse; the
  exceptions CUDA allows are kept (a device tensor indexed by a host index, ``copy_`` across
  devices, 0-d host tensors as scalars), and reading a device tensor into numpy raises like CUDA.

Model workers import this file as a plugin (``import_modules=[<this file>]``): the mode switches
on in worker processes only (``python -m realrl.apps.remote``), never in the process that runs
the master or the tests.
"""

from __future__ import annotations

import os
import sys

import torch
from torch.overrides import TorchFunctionMode

STAND_IN = torch.device("cpu", 0)  # the "GPU" of a checked run
# the options that put a quickstart run under the check; its workers' logs then hold MARKER
# (with the NCCL-rules check of tests/collective_rules.py: every checked run carries both)
_COLLECTIVE_RULES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "collective_rules.py")
OVERRIDES = ("device=cpu:0", f'import_modules=["{os.path.abspath(__file__)}","{_COLLECTIVE_RULES}"]')
MARKER = "device-discipline check: on"
# what FSDP is told of a host tensor: a device other than its CPU mesh's, so that it moves the
# tensor to its device as it would on a GPU (where host memory is not the mesh's device)
ELSEWHERE = torch.device("cpu", 1)
_TAG = "_device_discipline_tag"
HOST, DEVICE = "host", "device"


class DeviceMixError(RuntimeError):
    """A device tensor met a host tensor in one operation (CUDA would refuse it)."""


def _name(func) -> str:
    return getattr(func, "__qualname__", None) or getattr(func, "__name__", None) or repr(func)


def _device_tag(device) -> str | None:
    if device is None:
        return None
    device = torch.device(device)
    if device.type != "cpu":
        return DEVICE
    return DEVICE if device.index is not None else HOST


def _named_device_tag(device, caller: str) -> str | None:
    """The tag of a tensor made on or moved to ``device`` by code in module ``caller``.

    torch.distributed (FSDP2, DTensor) places what it makes (gathered weights, moved states) on
    its mesh's device, the compute device; a CPU mesh names it ``cpu``, which here would read as
    host memory, so within torch.distributed ``cpu`` is the device."""
    tag = _device_tag(device)
    if tag == HOST and caller.startswith("torch.distributed"):
        return DEVICE
    return tag


_DEVICE_OF = torch.Tensor.device.__get__
_DATA_SET = torch.Tensor.data.__set__  # param.data = moved: how Module.to moves a parameter
_METADATA = {torch._has_compatible_shallow_copy_type}  # compares types, computes nothing
_MOVES = {torch.Tensor.to, torch.Tensor.cpu, torch.Tensor.cuda}
_CROSS_DEVICE_OK = {torch.Tensor.copy_}  # cuda.copy_(cpu) and cpu.copy_(cuda) are fine
# cuda[cpu_index] and cuda[cpu_index] = cuda_value are fine (the index is copied over)
_INDEXING = {torch.Tensor.__getitem__, torch.Tensor.__setitem__}


class DeviceDiscipline(TorchFunctionMode):
    """The mode itself; ``active()`` is the one instance a worker enters at import."""

    # -- tags: an attribute of the tensor (no weak references: those would stop torch from
    # swapping a module's parameters, as ``Module.to`` does for tensor subclasses) -------------

    def tag_of(self, t: torch.Tensor) -> str | None:
        tag = t.__dict__.get(_TAG)
        if tag is not None:
            return tag
        if isinstance(t, torch.nn.Parameter):
            return DEVICE  # a model's weights live on its device (an offloaded model visits it)
        return None

    def tag(self, t: torch.Tensor, tag: str | None) -> None:
        if tag is not None:
            t.__dict__[_TAG] = tag

    # -- the rule ------------------------------------------------------------------------------

    def check(self, func, args, tensors: list[torch.Tensor]) -> None:
        device = [t for t in tensors if self.tag_of(t) == DEVICE]
        host = [t for t in tensors if self.tag_of(t) == HOST and t.dim() > 0]
        if not device or func in _CROSS_DEVICE_OK:
            return
        if func is torch.Tensor.numpy:
            raise DeviceMixError("numpy() of a device tensor (CUDA needs .cpu() first)")
        if not host:
            return
        if func in _INDEXING and self.tag_of(tensors[0]) == DEVICE:
            value = args[2] if func is torch.Tensor.__setitem__ else None
            if not (isinstance(value, torch.Tensor) and self._host_value(value)):
                return
        raise DeviceMixError(
            f"{_name(func)} combines device tensor(s) {[tuple(t.shape) for t in device][:3]} with "
            f"host tensor(s) {[tuple(t.shape) for t in host][:3]}: on a GPU this raises"
        )

    def _host_value(self, t: torch.Tensor) -> bool:
        return self.tag_of(t) == HOST and t.dim() > 0

    def out_tag(self, func, args, kwargs, tensors: list[torch.Tensor], caller: str) -> str | None:
        if func is torch.Tensor.cpu:
            return HOST
        if func is torch.Tensor.cuda:
            return DEVICE
        if func is torch.Tensor.to:
            device = torch._C._nn._parse_to(*args[1:], **kwargs)[0]
            return _named_device_tag(device, caller) or self.tag_of(args[0])
        if func in _CROSS_DEVICE_OK:
            return self.tag_of(args[0])
        if "device" in kwargs:
            return _named_device_tag(kwargs["device"], caller)
        tags = {self.tag_of(t) for t in tensors}
        if DEVICE in tags:
            return DEVICE
        if HOST in tags or not tensors:
            return HOST  # computed from host tensors, or made from Python values
        return None

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func == _DEVICE_OF:  # a device tensor says where it lives, as a CUDA one would
            # torch's own code (meshes, FSDP, checkpointing's metadata checks) sees the real device
            caller = sys._getframe(1).f_globals.get("__name__", "")
            tag = self.tag_of(args[0])
            if tag == DEVICE and not caller.startswith("torch."):
                return STAND_IN
            if tag == HOST and caller.startswith("torch.distributed.fsdp"):
                return ELSEWHERE  # not on FSDP's (CPU) device yet: FSDP moves it, as on a GPU
            return func(*args, **kwargs)
        if func in _METADATA:
            return func(*args, **kwargs)
        if func == _DATA_SET:  # the parameter now lives where its new data does
            func(*args, **kwargs)
            self.tag(args[0], self.tag_of(args[1]))
            return None
        tensors = _tensors(args, kwargs)
        self.check(func, args, tensors)
        out = func(*args, **kwargs)
        tag = self.out_tag(func, args, kwargs, tensors, sys._getframe(1).f_globals.get("__name__", ""))
        if func in _MOVES and out is args[0] and tag != self.tag_of(out):
            out = out.view_as(out)  # a no-op move that changes the tag: an alias carries the new tag
        if isinstance(out, torch.Tensor):
            self.tag(out, tag)
        elif isinstance(out, (tuple, list)):
            for t in out:
                if isinstance(t, torch.Tensor):
                    self.tag(t, tag)
        return out


def _tensors(args, kwargs) -> list[torch.Tensor]:
    """The tensors among the arguments, one level into lists and tuples (``torch.cat``'s)."""
    out = []
    for a in (*args, *kwargs.values()):
        if isinstance(a, torch.Tensor):
            out.append(a)
        elif isinstance(a, (tuple, list)):
            out.extend(t for t in a if isinstance(t, torch.Tensor))
    return out


def in_model_worker() -> bool:
    main = sys.modules.get("__main__")
    spec = getattr(main, "__spec__", None)
    return spec is not None and spec.name == "realrl.apps.remote"


if in_model_worker():
    # on for the rest of the worker's life: every call of every model runs under the rule
    DeviceDiscipline().__enter__()
    print(MARKER, file=sys.stderr, flush=True)
