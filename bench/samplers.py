"""Samplers that disagree with the trainer the way serving does (docs/score-centering.md, "When to turn it on").

A sampler is a copy of the trainer's weights, ``lag`` optimizer steps old, served at a ``precision``:

- ``fp32``: the trainer's own arithmetic (only the lag differs);
- ``bf16``: the whole model in bfloat16, weights and activations (a bf16 inference engine);
- ``int8`` / ``int4``: every linear and embedding weight fake-quantized per output channel (symmetric, the
  channel's absolute maximum mapped to the largest level, round to nearest), activations in float32: what
  weight-only int8 (or fp8 with per-channel scales) and int4 serving do to the logits. The tied embedding is
  the LM head, so it is quantized per vocabulary row.
"""

from __future__ import annotations

import copy
from typing import NamedTuple

import torch

PRECISIONS = ("fp32", "bf16", "int8", "int4")


class Sampler(NamedTuple):
    """A sampler setting: the precision it serves at and the optimizer steps its weights lag behind."""

    precision: str
    lag: int

    @property
    def name(self) -> str:
        return self.precision + (f", lag {self.lag}" if self.lag else "")


def parse_sampler(text: str, lag: int = 0) -> Sampler:
    """``fp32``, ``bf16``, ``int8`` or ``int4`` (with ``lag``); a one-line ValueError for anything else."""
    if text not in PRECISIONS:
        raise ValueError(f"--sampler: one of {', '.join(PRECISIONS)} expected, got {text!r}")
    if lag < 0:
        raise ValueError(f"--lag: 0 or more optimizer steps expected, got {lag}")
    return Sampler(text, lag)


def quantize_per_channel(weight: torch.Tensor, bits: int) -> torch.Tensor:
    """``weight`` [out, in] rounded to ``2**(bits-1) - 1`` symmetric levels per output row (its absolute
    maximum is the top level); an all-zero row stays zero."""
    top = 2 ** (bits - 1) - 1
    scale = weight.abs().amax(dim=1, keepdim=True).clamp(min=torch.finfo(weight.dtype).tiny) / top
    return (weight / scale).round().clamp(-top, top) * scale


def make_sampler_model(trainer: torch.nn.Module, sampler: Sampler) -> torch.nn.Module:
    """A copy of ``trainer`` to serve at ``sampler.precision`` (weights are loaded by ``load_sampler_weights``)."""
    model = copy.deepcopy(trainer).eval()
    return model.to(torch.bfloat16) if sampler.precision == "bf16" else model


@torch.no_grad()
def load_sampler_weights(model: torch.nn.Module, state: dict, sampler: Sampler) -> None:
    """Load the trainer's ``state`` into the sampler ``model``, cast (bf16) or fake-quantized (int8/int4)."""
    model.load_state_dict(state)  # a bf16 model casts on copy
    if sampler.precision not in ("int8", "int4"):
        return
    bits = int(sampler.precision[3:])
    weights = {
        id(m.weight): m.weight for m in model.modules() if isinstance(m, torch.nn.Linear | torch.nn.Embedding)
    }
    for weight in weights.values():  # a tied embedding once
        weight.copy_(quantize_per_channel(weight, bits))
