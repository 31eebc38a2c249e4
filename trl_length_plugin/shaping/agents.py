"""Per-agent parameters as per-group tensors (docs/reference/length-penalties.md §2.3)."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from .config import DEFAULT_AGENT, LengthPenaltyConfig, LengthPenaltyParams
from .groups import any_set
from .terms import key_choices, switched_on


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
        """Per-group values of a parameter: bool, float64, or for a string its index in its options (the
        term's declaration, ``Parameter.choices``)."""
        if name not in self._cache:
            values = [getattr(params, name) for params in self.params]
            choices = key_choices(name)
            if choices:
                values, dtype = [choices.index(value) for value in values], torch.long
            else:
                dtype = torch.bool if isinstance(values[0], bool) else torch.float64
            if len(values) == 1:  # one agent: one fill instead of a gather
                self._cache[name] = torch.full((self.codes.numel(),), values[0], dtype=dtype)
            else:
                self._cache[name] = torch.tensor(values, dtype=dtype).index_select(0, self.codes)
        return self._cache[name]

    def uses(self, *names: str) -> bool:
        """Whether any agent sets one of these parameters to a non-zero value (a mode: not none)."""
        return any(switched_on(getattr(p, name)) for p in self.params for name in names)

    def agree(self, names: tuple[str, ...]) -> bool | None:
        """True when every agent sets each of ``names`` above 0, False when none does, None when they differ or
        a value is not a number (a string key compares by its index, per group)."""
        values = [[getattr(params, name) for name in names] for params in self.params]
        if any(isinstance(value, str) for row in values for value in row):
            return None
        on = {all(value > 0 for value in row) for row in values}
        return on.pop() if len(on) == 1 else None

    def agents_where(self, flags: torch.Tensor) -> list[str]:
        """Names of the agents owning at least one flagged group."""
        if len(self.names) == 1:
            return list(self.names) if any_set(flags) else []
        return [self.names[code] for code in torch.unique(self.codes[flags]).tolist()]
