"""The adaptive-ppo-clip controller: the offset k of the upper bound hi + k, stepped once per optimizer step
(docs/reference/score-centering.md §5.7), with its metric names (§5.6) and its checkpoint file. Shared by
every host: a host sums the counts over its processes and calls :meth:`AdaptiveClipController.step_metrics`
once per optimizer step, :meth:`~AdaptiveClipController.save` and :meth:`~AdaptiveClipController.restore`
with its checkpoint folders.

After each optimizer step, f is the fraction of valid sampled tokens with A > 0 whose ratio r = p(y) / q(y)
(trainer over sampler, detached) exceeds hi + k, over the whole step and every process (the host sums the
counts); then k <- clamp(k + delta if f > target else k - delta, k_min, k_max). Hosts keep its state in
``STATE_FILE`` inside each checkpoint folder.
"""

from __future__ import annotations

import json
import logging
import math
import os
from dataclasses import asdict, dataclass

import torch

#: the controller's state in a checkpoint folder
STATE_FILE = "score_centering_state.json"
#: the controller's metrics of each optimizer step (reference §5.6): f, and k after the step
CLIP_FRACTION_METRIC = "score_centering/adaptive_clip_frac"
K_METRIC = "score_centering/adaptive_k"
logger = logging.getLogger("trl_length_plugin")


@dataclass
class AdaptiveClipController:
    """k and its rule; ``counts`` accumulates (clipped, positive) token counts until :meth:`step`."""

    k: float
    target: float
    delta: float
    k_min: float
    k_max: float
    clipped: float = 0.0
    positive: float = 0.0

    @classmethod
    def from_config(cls, config) -> AdaptiveClipController:
        """From a ``ScoreCenteringConfig``."""
        return cls(
            k=config.score_centering_adaptive_k_init,
            target=config.score_centering_adaptive_target,
            delta=config.score_centering_adaptive_k_delta,
            k_min=config.score_centering_adaptive_k_min,
            k_max=config.score_centering_adaptive_k_max,
        )

    @staticmethod
    def counts(
        ratio: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor, upper: float
    ) -> torch.Tensor:
        """(tokens above ``upper`` with A > 0, tokens with A > 0) among the valid ones, detached, float64."""
        with torch.no_grad():
            positive = mask.bool() & (advantages > 0)
            return torch.stack([(positive & (ratio > upper)).sum(), positive.sum()]).double()

    @classmethod
    def counts_from_logprobs(
        cls,
        logprobs: torch.Tensor,
        sampler_logprobs: torch.Tensor,
        advantages: torch.Tensor,
        mask: torch.Tensor,
        upper: float,
    ) -> torch.Tensor:
        """:meth:`counts` of the ratio r = exp(logprobs - sampler_logprobs) of each sampled token (trainer over
        sampler, detached; 1 outside ``mask``), ``advantages`` broadcast to ``mask``."""
        with torch.no_grad():
            ratio = torch.where(mask.bool(), logprobs.detach() - sampler_logprobs, 0.0).exp()
            return cls.counts(ratio, advantages.expand_as(mask), mask, upper)

    def accumulate(self, counts: torch.Tensor) -> None:
        """Add one micro-batch's (globally summed) counts."""
        clipped, positive = counts.tolist()
        self.clipped += clipped
        self.positive += positive

    def step(self) -> float:
        """Update k from the accumulated step and reset the counts; returns f (0 without positive tokens)."""
        fraction = self.clipped / self.positive if self.positive else 0.0
        moved = self.k + self.delta if fraction > self.target else self.k - self.delta
        self.k = min(max(moved, self.k_min), self.k_max)
        self.clipped = self.positive = 0.0
        return fraction

    def step_metrics(self) -> dict[str, float]:
        """:meth:`step`, as the step's metrics: f and k after the step (reference §5.6)."""
        fraction = self.step()
        return {CLIP_FRACTION_METRIC: fraction, K_METRIC: self.k}

    def state_dict(self) -> dict:
        return asdict(self)

    def load_state_dict(self, state: dict) -> None:
        """Take a saved state: every field of the controller, each a finite number, k within [k_min, k_max];
        ``ValueError`` (one line) for any other."""
        names = set(asdict(self))
        if not isinstance(state, dict) or set(state) != names:
            raise ValueError(f"a controller state holds exactly {sorted(names)}, got {state!r:.200}")
        bad = [
            n
            for n, v in state.items()
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v)
        ]
        if bad:
            raise ValueError(f"{bad[0]} must be a finite number, got {state[bad[0]]!r}")
        if not state["k_min"] <= state["k"] <= state["k_max"]:
            raise ValueError(
                f"k={state['k']} is outside [k_min, k_max] = [{state['k_min']}, {state['k_max']}]"
            )
        for name, value in state.items():
            setattr(self, name, float(value))

    def save(self, folder: str) -> None:
        """Write the state to ``folder/STATE_FILE`` (the folder is made when missing)."""
        os.makedirs(folder, exist_ok=True)
        with open(os.path.join(folder, STATE_FILE), "w") as state:
            json.dump(self.state_dict(), state)

    def load(self, folder: str) -> bool:
        """Restore the state from ``folder/STATE_FILE``; False (state unchanged) when the file is missing."""
        path = os.path.join(folder, STATE_FILE)
        if not os.path.exists(path):
            return False
        try:
            with open(path) as state:
                self.load_state_dict(json.load(state))
        except (OSError, ValueError) as err:  # a corrupted or hand-edited file: never half taken
            message = " ".join(str(err).split())
            raise ValueError(
                f"score centering: the checkpoint's controller state {path} is unreadable ({message}); remove it "
                "to restart the controller from k_init"
            ) from None
        return True

    def restore(self, folder: str) -> None:
        """On resume from ``folder``: :meth:`load`, with a warning when the checkpoint has no state."""
        if not self.load(folder):
            logger.warning(
                "trl-length-plugin: %s not found; the adaptive-ppo-clip controller restarts from k_init",
                os.path.join(folder, STATE_FILE),
            )
