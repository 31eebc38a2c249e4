"""``off``: no importance sampling; m = q, alpha = rho, sampled-token weight 1 (reference §5.1)."""

from trl_length_plugin.score_centering.modes import ImportanceSampling, register_mode


def coefficients(head, window):
    return head.q, head.rho


def weights(ratio, window):
    import torch

    return torch.ones_like(ratio)


register_mode(ImportanceSampling("off", coefficients, weights, order=0))
