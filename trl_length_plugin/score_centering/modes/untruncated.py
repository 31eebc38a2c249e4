"""``is``: untruncated token-level importance sampling; m = p, alpha = 1, so C is exactly 0; the sampled-token
weight is the ratio itself, which no host has: the plugin writes it (reference §5.1, §5.5)."""

from trl_length_plugin.score_centering.modes import ImportanceSampling, register_mode


def coefficients(head, window):
    import torch

    return head.p, torch.ones_like(head.rho)


def weights(ratio, window):
    return ratio


register_mode(
    ImportanceSampling(
        "is",
        coefficients,
        weights,
        written=True,
        order=1,
    )
)
