"""The data every part of realrl exchanges: packed, unpadded, variable-length batches.

A ``SequenceSample`` holds ``bs`` samples. For each key, ``data[key]`` is one tensor whose first
dimension packs every sequence of every sample back to back, and ``seqlens[key][i]`` lists the
lengths of the sequences of sample ``i`` under that key (a reward pair has two, a prompt with K
answers has K). How long a key is relative to its sample's tokens is declared in the ``KeySpec``
registry, never hard-coded (the key contract: docs/datasets.md).

This module imports no torch: the master holds samples without tensors (``data=None``) and must
stay free of it, so dtypes are names (``"int64"``; ``realrl.api.core.dtype_names``) and the few
methods that touch tensors import torch where they run, in workers, which have it already.

Re-exported by ``realrl.api.core.data_api`` (the stable import path).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Hashable, Sequence
from itertools import accumulate, chain
from typing import TYPE_CHECKING, Any

from realrl.api.core.dtype_names import dtype_name
from realrl.api.core.key_spec import get_key_spec, registered_keys
from realrl.api.core.microbatch import MicroBatchSpec
from realrl.base import datapack
from realrl.base.registry import UnknownNameError

if TYPE_CHECKING:
    import torch


def _as_int_lists(seqlens: dict[str, Sequence[Sequence[int]]]) -> dict[str, list[list[int]]]:
    out = {}
    for k, per_sample in seqlens.items():
        rows = []
        for i, lens in enumerate(per_sample):
            if hasattr(lens, "tolist"):  # a tensor or array of lengths
                lens = lens.tolist()
            if isinstance(lens, int):
                raise ValueError(
                    f"seqlens[{k!r}][{i}] must be a list of ints (one per sequence), got {lens!r}"
                )
            row = list(map(int, lens))
            if row and min(row) < 0:
                raise ValueError(f"seqlens[{k!r}][{i}] has a negative length: {row}")
            rows.append(row)
        out[k] = rows
    return out


def _check_unique_ids(ids: list[Hashable]) -> None:
    if len(set(ids)) != len(ids):
        dup = sorted({str(i) for i in ids if ids.count(i) > 1})
        raise ValueError(f"SequenceSample ids must be unique; repeated: {dup}")


@dataclasses.dataclass
class SequenceSample:
    """A batch of ``bs`` samples, each with one or more packed sequences per key."""

    keys: set[str]
    trailing_shapes: dict[str, tuple[int, ...]]
    dtypes: dict[str, str]  # dtype names; a torch.dtype given here is stored as its name
    ids: list[Hashable]
    seqlens: dict[str, list[list[int]]]
    data: dict[str, torch.Tensor | None] | None = None
    metadata: dict[str, list[Any]] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        self.keys = set(self.keys)
        self.ids = list(self.ids)
        self.trailing_shapes = {k: tuple(v) for k, v in self.trailing_shapes.items()}
        self.dtypes = {k: dtype_name(v) for k, v in self.dtypes.items()}
        self.seqlens = _as_int_lists(self.seqlens)
        self.metadata = {k: list(v) for k, v in (self.metadata or {}).items()}
        self._validate()

    @classmethod
    def _from_canonical(
        cls,
        keys: set[str],
        trailing_shapes: dict[str, tuple[int, ...]],
        dtypes: dict[str, str],
        ids: list[Hashable],
        seqlens: dict[str, list[list[int]]],
        data: dict[str, torch.Tensor | None] | None,
        metadata: dict[str, list[Any]],
    ) -> SequenceSample:
        """Wrap parts already in the form ``__post_init__`` would give them (fresh containers, a
        set, tuples, lists of non-negative int lists), skipping its copies and ``_validate``: for
        ``from_default`` and ``gather``, which build such parts and check what they cannot know,
        and for slices, selections and copies of a sample that was validated when it was built."""
        self = cls.__new__(cls)
        self.keys = keys
        self.trailing_shapes = trailing_shapes
        self.dtypes = dtypes
        self.ids = ids
        self.seqlens = seqlens
        self.data = data
        self.metadata = metadata
        return self

    # -- validation ------------------------------------------------------------------------

    def _validate(self) -> None:
        _check_unique_ids(self.ids)
        keys = self.keys
        for field in ("seqlens", "trailing_shapes", "dtypes"):
            if getattr(self, field).keys() != keys:
                have = set(getattr(self, field))
                raise ValueError(
                    f"SequenceSample.{field} keys {sorted(have)} differ from keys "
                    f"{sorted(keys)} (missing: {sorted(keys - have)}, "
                    f"extra: {sorted(have - keys)})"
                )
        bs = self.bs
        for k in keys:
            if len(self.seqlens[k]) != bs:
                raise ValueError(
                    f"key {k!r}: seqlens has {len(self.seqlens[k])} samples but there are {bs} ids"
                )
        self._validate_metadata()
        if self.data is None:
            return
        if set(self.data) != keys:
            raise ValueError(f"SequenceSample.data keys {sorted(self.data)} differ from keys {sorted(keys)}")
        self._validate_tensors()

    def _validate_metadata(self) -> None:
        bs = self.bs
        for k, v in self.metadata.items():
            if len(v) != bs:
                raise ValueError(f"metadata {k!r} has {len(v)} entries but there are {bs} ids")

    def _validate_tensors(self) -> None:
        """Each tensor against its key's seqlens, trailing shape and dtype."""
        import torch  # only samples holding tensors get here: in a worker, torch is loaded

        for k, t in self.data.items():
            if t is None:
                continue
            if not isinstance(t, torch.Tensor):
                raise ValueError(f"key {k!r}: data must be a torch.Tensor, got {type(t).__name__}")
            total = sum(map(sum, self.seqlens[k]))
            shape = t.shape
            if shape[0] != total:
                raise ValueError(f"key {k!r}: data has {shape[0]} rows but seqlens sum to {total}")
            if shape[1:] != self.trailing_shapes[k]:
                raise ValueError(
                    f"key {k!r}: trailing shape {tuple(shape[1:])} differs from declared "
                    f"{self.trailing_shapes[k]}"
                )
            if dtype_name(t.dtype) != self.dtypes[k]:
                raise ValueError(f"key {k!r}: dtype {t.dtype} differs from declared {self.dtypes[k]}")

    # -- construction ------------------------------------------------------------------------

    @classmethod
    def from_default(
        cls,
        ids: Sequence[Hashable],
        seqlens: Sequence[int | Sequence[int]],
        data: dict[str, torch.Tensor],
        metadata: dict[str, list[Any]] | None = None,
    ) -> SequenceSample:
        """Build from token counts: ``seqlens[i]`` is sample i's token length (or one length
        per sequence of that sample); each key's lengths follow its registered ``KeySpec``."""
        if len(seqlens) != len(ids):
            raise ValueError(f"from_default: {len(seqlens)} seqlens for {len(ids)} ids")
        per_seq = [[int(s)] if isinstance(s, int) else list(map(int, s)) for s in seqlens]
        lens: dict[str, list[list[int]]] = {}
        for k in data:
            try:
                length = get_key_spec(k).length
            except UnknownNameError:
                raise ValueError(
                    f"from_default: key {k!r} has no KeySpec; declare it with "
                    f"register_key_spec({k!r}, kind, dtype) (registered: {registered_keys()})"
                ) from None
            lens[k] = [list(map(length, row)) for row in per_seq]
        parts = dict(
            keys=set(data),
            trailing_shapes={k: tuple(v.shape[1:]) for k, v in data.items()},
            dtypes={k: dtype_name(v.dtype) for k, v in data.items()},
            ids=list(ids),
            seqlens=lens,
            data=dict(data),
        )
        if any(row and min(row) < 0 for row in per_seq):
            return cls(**parts, metadata=metadata or {})  # __post_init__ names the negative length
        # Keys, seqlens, shapes and dtypes agree by construction; check what the caller gave.
        x = cls._from_canonical(**parts, metadata={k: list(v) for k, v in (metadata or {}).items()})
        _check_unique_ids(x.ids)
        x._validate_metadata()
        x._validate_tensors()
        return x

    @classmethod
    def gather(cls, samples: Sequence[SequenceSample], keys: Sequence[str] | None = None):
        """Concatenate samples (in order) into one batch over ``keys`` (default: the first's).

        The samples were validated when built, so only what joining them can break is checked:
        keys, trailing shapes, dtypes, metadata keys and unique ids."""
        if not samples:
            raise ValueError("gather needs at least one SequenceSample")
        first = samples[0]
        keys = set(first.keys if keys is None else keys)
        shapes0 = dtypes0 = None
        for j, s in enumerate(samples):
            if not keys <= s.keys:
                missing = keys - s.keys
                raise ValueError(f"gather: sample {j} (ids {s.ids[:3]}...) lacks keys {sorted(missing)}")
            if shapes0 is None:
                shapes0 = {k: s.trailing_shapes[k] for k in keys}
                dtypes0 = {k: s.dtypes[k] for k in keys}
            elif not (s.trailing_shapes == shapes0 and s.dtypes == dtypes0):
                for k in keys:  # same keys but a mismatch, or extra keys: compare key by key
                    if s.trailing_shapes[k] != shapes0[k]:
                        raise ValueError(f"gather: key {k!r} has different trailing shapes across samples")
                    if s.dtypes[k] != dtypes0[k]:
                        raise ValueError(f"gather: key {k!r} has different dtypes across samples")
        meta_keys = first.metadata.keys()
        for j, s in enumerate(samples):
            if s.metadata.keys() != meta_keys:
                raise ValueError(
                    f"gather: sample {j} has metadata keys {sorted(s.metadata)}, expected {sorted(meta_keys)}"
                )
        has_data = [s.data is not None for s in samples]
        if any(has_data) and not all(has_data):
            raise ValueError("gather: cannot mix metadata-only samples with samples holding data")
        data = None
        if all(has_data):
            import torch  # samples holding tensors: in a worker, where torch is loaded

            data = {}
            for k in keys:
                parts = [s.data[k] for s in samples]
                present = [p for p in parts if p is not None]
                if len(present) == len(parts):
                    data[k] = torch.cat(parts, dim=0)
                elif present:
                    raise ValueError(f"gather: key {k!r} is None in some samples only")
                else:
                    data[k] = None
        ids = [i for s in samples for i in s.ids]
        _check_unique_ids(ids)
        return cls._from_canonical(
            keys=keys,
            trailing_shapes=shapes0,
            dtypes=dtypes0,
            ids=ids,
            # fresh row lists, as __post_init__ would make: the batch never aliases its items' rows
            seqlens={k: list(map(list, chain.from_iterable([s.seqlens[k] for s in samples]))) for k in keys},
            data=data,
            metadata={m: [v for s in samples for v in s.metadata[m]] for m in set(meta_keys)},
        )

    # -- views -------------------------------------------------------------------------------

    @property
    def bs(self) -> int:
        return len(self.ids)

    def sample_offsets(self, key: str) -> list[int]:
        """Start row of each sample in ``data[key]``, plus the total at the end."""
        return list(accumulate(map(sum, self.seqlens[key]), initial=0))

    def flat_seqlens(self, key: str) -> list[int]:
        """Lengths of every sequence of ``key`` in packing order."""
        return [x for row in self.seqlens[key] for x in row]

    def cu_seqlens(self, key: str) -> torch.Tensor:
        """int32 cumulative sequence boundaries of ``key`` (flash-attn varlen layout)."""
        import torch  # called by workers on the tensors they hold

        lens = torch.tensor([0] + self.flat_seqlens(key), dtype=torch.int32)
        return torch.cumsum(lens, dim=0, dtype=torch.int32)

    def token_counts(self) -> list[int]:
        """Tokens per sample: the largest total over keys (what a micro-batch budget counts)."""
        return [max((sum(self.seqlens[k][i]) for k in self.keys), default=0) for i in range(self.bs)]

    def _offsets(self) -> dict[str, list[int]]:
        """``sample_offsets`` of every key holding a tensor, computed once for many slices."""
        if self.data is None:
            return {}
        return {k: self.sample_offsets(k) for k, t in self.data.items() if t is not None}

    def _slice(self, start: int, end: int, offsets: dict[str, list[int]] | None = None) -> SequenceSample:
        """Samples ``start:end``. A slice of a valid sample is valid: it is wrapped, not re-checked."""
        if offsets is None:
            offsets = self._offsets()
        data = None
        if self.data is not None:
            data = {
                k: None if t is None else t[offsets[k][start] : offsets[k][end]] for k, t in self.data.items()
            }
        return SequenceSample._from_canonical(
            keys=set(self.keys),
            trailing_shapes=dict(self.trailing_shapes),
            dtypes=dict(self.dtypes),
            ids=self.ids[start:end],
            seqlens={k: [list(r) for r in v[start:end]] for k, v in self.seqlens.items()},
            data=data,
            metadata={k: list(v[start:end]) for k, v in self.metadata.items()},
        )

    def unpack(self) -> list[SequenceSample]:
        """One single-sample ``SequenceSample`` per id."""
        offsets = self._offsets()
        return [self._slice(i, i + 1, offsets) for i in range(self.bs)]

    def split_with_lengths(self, lens: Sequence[int]) -> list[SequenceSample]:
        """Contiguous pieces of ``lens[j]`` samples each."""
        if sum(lens) != self.bs or any(n <= 0 for n in lens):
            raise ValueError(f"split_with_lengths: {list(lens)} must be positive and sum to {self.bs}")
        offsets = self._offsets()
        pieces, start = [], 0
        for n in lens:
            pieces.append(self._slice(start, start + n, offsets))
            start += n
        return pieces

    def split(self, mb_spec: MicroBatchSpec) -> list[SequenceSample]:
        """Token-balanced contiguous pieces following ``mb_spec`` (see ``MicroBatchSpec``)."""
        bounds = datapack.partition_under_budget(
            self.token_counts(), mb_spec.n_mbs, mb_spec.max_tokens_per_mb
        )
        offsets = self._offsets()
        return [self._slice(s, e, offsets) for s, e in bounds]

    def select(self, keys: Sequence[str]) -> SequenceSample:
        """A sample with only ``keys`` (tensors are shared, not copied)."""
        keys = set(keys)
        missing = keys - self.keys
        if missing:
            raise ValueError(f"select: keys {sorted(missing)} not in {sorted(self.keys)}")
        return SequenceSample._from_canonical(  # a part of a valid sample: fresh containers, no re-check
            keys=keys,
            trailing_shapes={k: self.trailing_shapes[k] for k in keys},
            dtypes={k: self.dtypes[k] for k in keys},
            ids=list(self.ids),
            seqlens={k: [list(r) for r in self.seqlens[k]] for k in keys},
            data=None if self.data is None else {k: self.data[k] for k in keys},
            metadata={k: list(v) for k, v in self.metadata.items()},
        )

    def update_(self, other: SequenceSample) -> None:
        """Add (or overwrite) ``other``'s keys; both must hold the same ids in the same order."""
        if other.ids != self.ids:
            raise ValueError(f"update_: ids differ ({self.ids[:4]}... vs {other.ids[:4]}...)")
        if (self.data is None) != (other.data is None):
            raise ValueError("update_: cannot mix a metadata-only sample with one holding data")
        self.keys |= other.keys
        self.trailing_shapes.update(other.trailing_shapes)
        self.dtypes.update(other.dtypes)
        self.seqlens.update(other.seqlens)
        if self.data is not None:
            self.data.update(other.data)
        self.metadata.update(other.metadata)
        self._validate()

    def remap_keys_(self, mapping: dict[str, str]) -> None:
        """Rename keys in place: ``mapping[old] = new``."""
        missing = set(mapping) - self.keys
        if missing:
            raise ValueError(f"remap_keys_: keys {sorted(missing)} not in {sorted(self.keys)}")
        new_keys = {mapping.get(k, k) for k in self.keys}
        if len(new_keys) != len(self.keys):
            raise ValueError(f"remap_keys_: {mapping} maps two keys to one name")

        def remap(d: dict) -> dict:
            return {mapping.get(k, k): v for k, v in d.items()}

        self.keys = new_keys
        self.trailing_shapes = remap(self.trailing_shapes)
        self.dtypes = remap(self.dtypes)
        self.seqlens = remap(self.seqlens)
        if self.data is not None:
            self.data = remap(self.data)

    def meta(self) -> SequenceSample:
        """A copy without tensors: what the master worker holds."""
        return SequenceSample._from_canonical(
            keys=set(self.keys),
            trailing_shapes=dict(self.trailing_shapes),
            dtypes=dict(self.dtypes),
            ids=list(self.ids),
            seqlens={k: [list(r) for r in v] for k, v in self.seqlens.items()},
            data=None,
            metadata={k: list(v) for k, v in self.metadata.items()},
        )

    def to(self, device: torch.device | str) -> SequenceSample:
        """Move every tensor to ``device`` (in place; returns self for chaining)."""
        if self.data is not None:
            self.data = {k: None if v is None else v.to(device) for k, v in self.data.items()}
        return self

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, SequenceSample):
            return NotImplemented
        if (
            self.keys != other.keys
            or self.ids != other.ids
            or self.seqlens != other.seqlens
            or self.trailing_shapes != other.trailing_shapes
            or self.dtypes != other.dtypes
            or self.metadata != other.metadata
            or (self.data is None) != (other.data is None)
        ):
            return False
        if self.data is None:
            return True
        import torch  # both hold tensors: torch is loaded

        for k in self.keys:
            a, b = self.data[k], other.data[k]
            if (a is None) != (b is None) or (a is not None and not torch.equal(a, b)):
                return False
        return True
