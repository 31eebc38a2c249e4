"""Per-agent parameters as per-group tensors (docs/reference/length-penalties.md §2.3)."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from .config import BAND_CHANNELS, CHANNELS, DEFAULT_AGENT, LengthPenaltyConfig, LengthPenaltyParams

GATE_FIELDS = ("a", "b", "f")
TRUNCATION_MODES = ("none", "mask", "penalty", "incorrect")
TARGET_LENGTH_MODES = ("none", "exact", "max")
#: string parameters, held as their index in these options
CHOICES = {
    "group_length_penalty_profile_gate_channel": BAND_CHANNELS,
    "group_length_penalty_profile_gate_field": GATE_FIELDS,
    "overlong_channel": CHANNELS,
    "cosine_channel": CHANNELS,
    "truncation": TRUNCATION_MODES,
    "target_length": TARGET_LENGTH_MODES,
    "target_length_channel": CHANNELS,
}


class AgentParams:
    """The merged parameters of the agents in a batch as per-group tensors (a loop over agents only)."""

    def __init__(self, config: LengthPenaltyConfig, group_agents: list[Any] | None, num_groups: int):
        if group_agents is None:
            keys: list[Any] = [None]
            self.codes = torch.zeros(num_groups, dtype=torch.long)
        else:
            keys = list(dict.fromkeys(group_agents))
            lookup = {key: code for code, key in enumerate(keys)}
            codes = np.fromiter(map(lookup.__getitem__, group_agents), dtype=np.int64, count=num_groups)
            self.codes = torch.from_numpy(codes)
        self.names = [DEFAULT_AGENT if key is None else str(key) for key in keys]
        self.params: list[LengthPenaltyParams] = [config.for_agent(name) for name in self.names]
        self._cache: dict[str, torch.Tensor] = {}

    def __getitem__(self, name: str) -> torch.Tensor:
        """Per-group values of a parameter: bool, float64, or for a string its index in its options."""
        if name not in self._cache:
            values = [getattr(params, name) for params in self.params]
            if name in CHOICES:
                values, dtype = [CHOICES[name].index(value) for value in values], torch.long
            else:
                dtype = torch.bool if isinstance(values[0], bool) else torch.float64
            if len(values) == 1:  # one agent: one fill instead of a gather
                self._cache[name] = torch.full((self.codes.numel(),), values[0], dtype=dtype)
            else:
                self._cache[name] = torch.tensor(values, dtype=dtype).index_select(0, self.codes)
        return self._cache[name]

    def uses(self, *names: str) -> bool:
        """Whether any agent sets one of these parameters to a non-zero value (a mode: not none)."""
        return any(getattr(p, name) not in (0, False, "none") for p in self.params for name in names)

    def agents_where(self, flags: torch.Tensor) -> list[str]:
        """Names of the agents owning at least one flagged group."""
        return [self.names[code] for code in torch.unique(self.codes[flags]).tolist()]
