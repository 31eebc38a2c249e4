"""``adaptive-ppo-clip``: the filter of reference §5.7 with lo = 1 - the base loss's low clip, hi + k = 1 + its
high clip plus the controller's offset k, and the outer bound o: a ratio r is kept when r <= o, and r >= lo
for A < 0, r <= hi + k for A > 0 (A = 0: r <= o only). Head slots and the tail (1/rho) are filtered like
icepop's; the sampled-token weight is the ratio where kept, which no host has: the plugin writes it."""

from trl_length_plugin.score_centering.modes import ImportanceSampling, head_ratios, register_mode


def kept(ratio, advantages, window):
    """The filter for the sign of A (``advantages`` broadcast to ``ratio``)."""
    import torch

    lo, hi_plus_k = window.bounds
    by_sign = torch.where(advantages < 0, ratio >= lo, torch.where(advantages > 0, ratio <= hi_plus_k, True))
    return (ratio <= window.outer_bound) & by_sign


def coefficients(head, window):
    import torch

    ratio, inverse_rho = head_ratios(head)
    advantages = window.advantages.to(device=head.p.device)
    head_mass = torch.where(kept(ratio, advantages.unsqueeze(-1), window), head.p, 0.0)
    return head_mass, kept(inverse_rho, advantages, window).to(head.p.dtype)


def weights(ratio, window):
    import torch

    return torch.where(kept(ratio, window.advantages.to(ratio.device), window), ratio, 0.0)


register_mode(
    ImportanceSampling(
        "adaptive-ppo-clip",
        coefficients,
        weights,
        bounds="clip",
        written=True,
        controller=True,
        order=4,
    )
)
