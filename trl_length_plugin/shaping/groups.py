"""Prompt groups as padded matrices, so per-group work is one tensor operation (docs/reference/length-penalties.md §2.2).

Rows are grouped by integer ids; rows of a group need not be adjacent and groups may differ in size.
``GroupLayout`` packs the rows into slot-major ``[width, groups]`` matrices, one per power-of-two
width (a single one when groups have equal sizes), each row in a slot of its group in row order, and
splits them into buckets of at most ``CHUNK_SLOTS`` slots, so temporaries stay a few MB however large
the batch (larger ones are handed back to the OS and page-faulted in again on every call). Every
algorithm then runs on whole matrices: per-group values are ``(groups,)`` vectors that broadcast over
the slots, and reductions run over dimension 0 (whole contiguous vectors, much faster on CPU than
reducing many short rows). No loop runs over groups or rows; one runs over buckets.

The ``row_*`` helpers reduce a ``[width, groups]`` matrix over the slots selected by a boolean mask. Their
loops over the slots (sums, sorting networks, first hits) run numpy's operations on the same memory, in the
same order as torch's, at about a third of torch's cost per call (sums and comparisons give the same bits; a
minimum of ``0.0`` and ``-0.0`` may keep the other zero, which no comparison tells apart).
Masks are applied arithmetically (``BIG`` stands in for infinity) because ``torch.where`` on boolean
masks is several times slower than arithmetic on CPU; a boolean mask enters arithmetic through
``weights`` (a ``uint8`` view converts about three times faster than ``bool``).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from .threads import single_threaded

BIG = 1e300  # larger than any length or reward, small enough that BIG + x == BIG stays finite
CHUNK_SLOTS = 131_072  # slots per bucket: a [8, 3, 16384] float64 matrix is 3 MB


def on_cpu(tensor: torch.Tensor, name: str) -> torch.Tensor:
    """``tensor`` on the CPU, where the engine computes (copied from another device); a meta tensor, which
    holds no values, is a ValueError naming ``name`` (docs/reference/length-penalties.md §2.5)."""
    if tensor.is_meta:
        raise ValueError(
            f"{name} is a meta tensor (no values); the shaping step needs values on the CPU or a GPU"
        )
    return tensor.cpu()


def _integer_ids(group_index: Sequence | np.ndarray | torch.Tensor) -> torch.Tensor | list[int]:
    """The ids as an int64 tensor, or a list of Python ints (which may exceed int64); anything that is not
    integers (floats, NaN, bools, strings, None) is a ValueError naming ``group_index``."""
    if isinstance(group_index, torch.Tensor):
        group_index = on_cpu(group_index, "group_index")
        if group_index.is_floating_point() or group_index.is_complex() or group_index.dtype == torch.bool:
            raise ValueError(f"group_index must be integers, got a {group_index.dtype} tensor")
        return group_index.reshape(-1).long()
    if isinstance(group_index, np.ndarray) and group_index.dtype != object:
        if group_index.dtype.kind not in "iu":
            raise ValueError(f"group_index must be integers, got a {group_index.dtype} array")
        return torch.from_numpy(group_index.reshape(-1).astype(np.int64))
    items = group_index.tolist() if isinstance(group_index, np.ndarray) else list(group_index)
    if not set(map(type, items)) <= {int}:
        bad = [x for x in items if isinstance(x, bool) or not isinstance(x, int | np.integer)]
        if bad:
            raise ValueError(f"group_index must be integers, got {bad[0]!r} ({type(bad[0]).__name__})")
        items = [int(x) for x in items]
    return items


def dense_group_ids(group_index: Sequence | np.ndarray | torch.Tensor) -> torch.Tensor:
    """Map integer group ids to ``0..G-1`` (int64), numbering groups by first appearance."""
    ids = _integer_ids(group_index)
    if isinstance(ids, torch.Tensor):
        if ids.numel() < 2 or bool((ids[1:] >= ids[:-1]).all()):
            return torch.unique_consecutive(ids, return_inverse=True)[1]
        _, inverse = torch.unique(ids, return_inverse=True)
        first = torch.full((int(inverse.max()) + 1,), ids.numel(), dtype=torch.long)
        first.scatter_reduce_(0, inverse, torch.arange(ids.numel()), "amin")
        rank = torch.empty_like(first)
        rank[torch.argsort(first)] = torch.arange(first.numel())
        return rank[inverse]
    codes = {key: code for code, key in enumerate(dict.fromkeys(ids))}
    return torch.from_numpy(np.fromiter(map(codes.__getitem__, ids), dtype=np.int64, count=len(ids)))


@dataclass(frozen=True)
class Bucket:
    """Groups (``groups``, (Gb,)) whose size fits ``width``; ``rows``/``slots`` place each of their rows in
    the flattened ``[width, Gb]`` matrix; ``valid`` marks the slots holding a row. A *view* bucket
    (``rows`` and ``slots`` None) holds the consecutive groups from ``first_group`` of a batch whose
    groups all have ``width`` rows, in order: its rows are a slice of the batch."""

    width: int
    groups: torch.Tensor
    rows: torch.Tensor | None
    slots: torch.Tensor | None
    valid: torch.Tensor
    first_group: int = 0

    @property
    def is_view(self) -> bool:
        return self.rows is None

    def pack(self, values: torch.Tensor | Sequence[torch.Tensor], fill: float | bool = 0) -> torch.Tensor:
        """Per-row values as a ``[width, Gb]`` matrix, padding slots set to ``fill``; a sequence of C
        per-row tensors (channels) gives ``[width, C, Gb]``, each written once into its place."""
        if isinstance(values, torch.Tensor):
            return self._slots(values, fill).contiguous()
        return torch.stack([self._slots(channel, fill) for channel in values], 1)

    def _slots(self, values: torch.Tensor, fill: float | bool) -> torch.Tensor:
        """``[width, Gb]`` of one per-row tensor: a transposed view of the batch for a view bucket."""
        if self.rows is None:
            start = self.first_group * self.width
            return values[start : start + self.width * self.groups.numel()].reshape(-1, self.width).t()
        packed = values.new_full((self.width * self.groups.numel(),), fill)
        packed[self.slots] = values.index_select(0, self.rows)
        return packed.view(self.width, -1)

    def take(self, per_group: torch.Tensor) -> torch.Tensor:
        """The entries of a per-group tensor for this bucket's groups."""
        if self.rows is None:
            return per_group[self.first_group : self.first_group + self.groups.numel()]
        return per_group.index_select(0, self.groups)


class GroupLayout:
    """Dense group ids (``gid``), sizes, each row's position in its group, first rows and buckets.

    ``GroupLayout(group_index)`` accepts any per-row ids; functions taking ``group_index`` also accept
    a ready layout (for example ``RolloutBatch.layout``) to skip rebuilding it.
    """

    @single_threaded()
    def __init__(self, group_index: Sequence | np.ndarray | torch.Tensor):
        self.gid = dense_group_ids(group_index)
        self.num_rows = self.gid.numel()
        self.num_groups = int(self.gid.max()) + 1 if self.num_rows else 0
        self.sizes = torch.bincount(self.gid, minlength=self.num_groups)
        self._ordered = self.num_rows < 2 or bool((self.gid[1:] >= self.gid[:-1]).all())
        self._order = torch.arange(self.num_rows) if self._ordered else torch.argsort(self.gid, stable=True)
        self._starts = torch.cumsum(self.sizes, 0) - self.sizes
        self.first_row = self._order[self._starts]
        self.buckets = self._make_buckets()

    @staticmethod
    def of(group_index: GroupLayout | Sequence | np.ndarray | torch.Tensor) -> GroupLayout:
        return group_index if isinstance(group_index, GroupLayout) else GroupLayout(group_index)

    @functools.cached_property
    def position(self) -> torch.Tensor:
        """Each row's index within its group, in row order."""
        position = torch.empty_like(self.gid)
        position[self._order] = torch.arange(self.num_rows) - self._starts[self.gid[self._order]]
        return position

    def _make_buckets(self) -> list[Bucket]:
        if self.num_groups:
            smallest, largest = (int(size) for size in torch.aminmax(self.sizes))
            if self._ordered and smallest == largest and largest & (largest - 1) == 0:
                # groups of one power-of-two size, rows in group order: slices of the batch are the matrices
                per_bucket = max(1, CHUNK_SLOTS // largest)
                return [
                    Bucket(
                        largest, groups, None, None, torch.ones(largest, len(groups), dtype=torch.bool), start
                    )
                    for start, groups in zip(
                        range(0, self.num_groups, per_bucket),
                        torch.arange(self.num_groups).split(per_bucket),
                        strict=True,
                    )
                ]
        widths = torch.ones_like(self.sizes)
        big = self.sizes > 1
        widths[big] = 2 ** torch.ceil(torch.log2(self.sizes[big].double())).long()
        chunks, bucket_of, local = [], torch.empty_like(self.sizes), torch.empty_like(self.sizes)
        for width in torch.unique(widths).tolist():
            for groups in torch.nonzero(widths == width).flatten().split(max(1, CHUNK_SLOTS // width)):
                bucket_of[groups], local[groups] = len(chunks), torch.arange(groups.numel())
                chunks.append((width, groups))
        row_bucket = bucket_of[self.gid]
        rows_of = torch.argsort(row_bucket, stable=True).split(
            torch.bincount(row_bucket, minlength=len(chunks)).tolist()
        )
        buckets = []
        for (width, groups), rows in zip(chunks, rows_of, strict=True):
            slots = self.position[rows] * groups.numel() + local[self.gid[rows]]
            valid = torch.zeros(width * groups.numel(), dtype=torch.bool)
            valid[slots] = True
            buckets.append(Bucket(width, groups, rows, slots, valid.view(width, -1)))
        return buckets

    def unpack(self, parts: list[torch.Tensor], dtype: torch.dtype = torch.float64) -> torch.Tensor:
        """Per-row values from one ``[width, Gb]`` matrix per bucket (the inverse of ``pack``); an empty
        batch gives an empty ``dtype`` tensor."""
        if not parts:
            return torch.empty(0, dtype=dtype)
        if self.buckets[0].is_view:  # then all are, in row order
            rows = [part.t().reshape(-1) for part in parts]
            return rows[0] if len(rows) == 1 else torch.cat(rows)
        out = parts[0].new_empty(self.num_rows)
        for bucket, part in zip(self.buckets, parts, strict=True):
            out[bucket.rows] = part.reshape(-1).index_select(0, bucket.slots)
        return out

    def per_group(self, parts: list[torch.Tensor]) -> torch.Tensor:
        """A per-group tensor from one (Gb,) tensor per bucket."""
        if self.buckets[0].is_view:  # then all are, in group order
            return parts[0] if len(parts) == 1 else torch.cat(parts)
        out = parts[0].new_empty((self.num_groups, *parts[0].shape[1:]))
        for bucket, part in zip(self.buckets, parts, strict=True):
            out[bucket.groups] = part
        return out


def weights(mask: torch.Tensor, dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """A boolean mask as 1.0 / 0.0 values of ``dtype``."""
    return mask.view(torch.uint8).to(dtype)


def _filled(x: torch.Tensor, member: torch.Tensor, fill: float) -> torch.Tensor:
    """``x + fill`` where ``member`` (broadcastable to ``x``) is false, ``x`` elsewhere."""
    return torch.add(x, weights(~member, x.dtype), alpha=fill)


def any_set(mask: torch.Tensor) -> bool:
    """Whether any entry of a boolean tensor is set (a ``uint8`` max: ``any()`` on bool is twenty times
    slower)."""
    return mask.numel() > 0 and bool(mask.view(torch.uint8).amax())


def all_set(mask: torch.Tensor) -> bool:
    """Whether every entry of a boolean tensor is set (true when empty)."""
    return mask.numel() == 0 or bool(mask.view(torch.uint8).amin())


def row_any(mask: torch.Tensor) -> torch.Tensor:
    """Per group: whether any slot is set (a ``uint8`` max: ``any(0)`` on bool is ten times slower)."""
    return mask.view(torch.uint8).amax(0).view(torch.bool)


def row_all(mask: torch.Tensor) -> torch.Tensor:
    """Per group: whether every slot is set."""
    return mask.view(torch.uint8).amin(0).view(torch.bool)


def row_count(member: torch.Tensor) -> torch.Tensor:
    """Members per group (int64)."""
    return member.sum(0)


def row_sum(x: torch.Tensor) -> torch.Tensor:
    """Sum over the slots in slot order, like a plain loop (one add per slot; ``cumsum`` over dimension
    0 is several times slower)."""
    slots = x.numpy()
    total = slots[0].copy()
    for slot in slots[1:]:
        np.add(total, slot, out=total)
    return torch.from_numpy(total)


def row_min(x: torch.Tensor, member: torch.Tensor) -> torch.Tensor:
    """Smallest member value per group; ``BIG`` for a group without members."""
    return _filled(x, member, BIG).amin(0)


def row_max(x: torch.Tensor, member: torch.Tensor) -> torch.Tensor:
    """Largest member value per group; ``-BIG`` for a group without members."""
    return _filled(x, member, -BIG).amax(0)


def row_min_max(x: torch.Tensor, member: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``row_min`` and ``row_max`` of the same members, converting the mask once."""
    outside = weights(~member, x.dtype)
    return torch.add(x, outside, alpha=BIG).amin(0), torch.add(x, outside, alpha=-BIG).amax(0)


def row_first_extreme(x: torch.Tensor, member: torch.Tensor, largest: bool) -> torch.Tensor:
    """One-hot ``[width, groups]`` mask of the smallest (largest) member, the lowest slot on ties, so the
    lowest row index (slots follow row order); no hit in a group without members."""
    extreme = row_max(x, member) if largest else row_min(x, member)
    hit = (x == extreme).logical_and_(member)
    slots = hit.numpy()
    found = np.zeros_like(slots[0])
    for slot in slots:  # in slot order: keep each group's first hit only
        slot &= ~found
        found |= slot
    return hit


@functools.cache
def _sorting_network(width: int) -> tuple[tuple[int, int], ...]:
    """Batcher's odd-even merge sort comparators for a power-of-two ``width``."""
    pairs = []
    p = 1
    while p < width:
        k = p
        while k >= 1:
            for j in range(k % p, width - k, 2 * k):
                for i in range(min(k, width - j - k)):
                    if (i + j) // (2 * p) == (i + j + k) // (2 * p):
                        pairs.append((i + j, i + j + k))
            k //= 2
        p *= 2
    return tuple(pairs)


@functools.cache
def _bitonic_network(width: int) -> tuple[tuple[int, int], ...]:
    """The half-cleaner cascade that sorts a bitonic sequence of a power-of-two ``width``."""
    pairs, span = [], width // 2
    while span >= 1:
        pairs += [(i, i + span) for i in range(width) if not i & span]
        span //= 2
    return tuple(pairs)


def row_padded(x: torch.Tensor, member: torch.Tensor) -> torch.Tensor:
    """``x`` with the non-member slots set to ``BIG`` (the input of ``sorted_slots``)."""
    return _filled(x, member, BIG)


def sorted_slots(padded: torch.Tensor, bitonic: bool = False) -> torch.Tensor:
    """The values of each group sorted ascending over the slots; ``padded`` is overwritten.

    Up to 16 slots go through a sorting network on whole slot vectors (much faster than ``torch.sort``
    on many short rows); more slots use ``torch.sort``. ``bitonic``: each group's values first fall, then
    rise over the slots (the distances of sorted values to a point in their range), which the shorter
    bitonic network sorts (12 comparators instead of 19 for 8 slots, 32 instead of 63 for 16).
    """
    if padded.shape[0] > 16:
        return torch.sort(padded, dim=0).values
    network = (_bitonic_network if bitonic else _sorting_network)(padded.shape[0])
    padded = padded.contiguous()  # numpy writes through the memory: no slot may alias another
    slots = list(padded.numpy())
    spare = np.empty_like(slots[0])
    for i, j in network:  # in place: the old low slot becomes the spare
        low = np.minimum(slots[i], slots[j], out=spare)
        np.maximum(slots[i], slots[j], out=slots[j])
        slots[i], spare = low, slots[i]
    return torch.from_numpy(np.stack(slots))


def row_sorted(x: torch.Tensor, member: torch.Tensor) -> torch.Tensor:
    """Member values sorted ascending over the slots of each group, non-members (``BIG``) last."""
    return sorted_slots(row_padded(x, member))  # a fresh tensor: sorted in place


def row_pick(ordered: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """``ordered[index[g], g]`` with the index clamped into the slots."""
    return ordered.gather(0, index.clamp(0, ordered.shape[0] - 1)[None]).squeeze(0)


def sorted_median(ordered: torch.Tensor, count: torch.Tensor) -> torch.Tensor:
    """``statistics.median`` of the first ``count`` values of each group of ``sorted_slots``: the middle
    value, or the mean of the two middle values for an even count (docs/reference/length-penalties.md
    §2.9); meaningless where ``count`` is 0."""
    return (row_pick(ordered, (count - 1) >> 1) + row_pick(ordered, count >> 1)) / 2


def row_median(x: torch.Tensor, member: torch.Tensor, count: torch.Tensor) -> torch.Tensor:
    """``statistics.median`` of the members (``count`` of them per group), see ``sorted_median``."""
    return sorted_median(row_sorted(x, member), count)
