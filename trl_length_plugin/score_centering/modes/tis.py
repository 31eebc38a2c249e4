"""``tis``: truncated importance sampling in the host's bounds [lo, hi]; m = clamp(p, lo q, hi q), alpha =
clamp(1, lo rho, hi rho), the sampled-token weight clamped into the bounds (reference §5.1)."""

from trl_length_plugin.score_centering.modes import ImportanceSampling, register_mode


def _clamp(x, low, high):
    import torch

    return torch.minimum(torch.maximum(x, low), high)


def coefficients(head, window):
    import torch

    lo, hi = window.bounds
    one = torch.ones_like(head.rho)
    return _clamp(head.p, lo * head.q, hi * head.q), _clamp(one, lo * head.rho, hi * head.rho)


def weights(ratio, window):
    return ratio.clamp(*window.bounds)


register_mode(
    ImportanceSampling(
        "tis",
        coefficients,
        weights,
        bounds="host",
        order=2,
    )
)
