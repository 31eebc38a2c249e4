"""``icepop``: importance sampling masked outside the host's bounds [lo, hi]; a head slot keeps m = p where its
ratio p/q is in bounds, the tail keeps alpha = 1 where 1/rho is; the sampled-token weight is zeroed outside the
bounds (reference §5.1)."""

from trl_length_plugin.score_centering.modes import ImportanceSampling, head_ratios, in_bounds, register_mode


def coefficients(head, window):
    import torch

    ratio, inverse_rho = head_ratios(head)
    head_mass = torch.where(in_bounds(ratio, *window.bounds), head.p, 0.0)
    return head_mass, in_bounds(inverse_rho, *window.bounds).to(head.p.dtype)


def weights(ratio, window):
    import torch

    return torch.where(in_bounds(ratio, *window.bounds), ratio, 0.0)


register_mode(
    ImportanceSampling(
        "icepop",
        coefficients,
        weights,
        bounds="host",
        order=3,
    )
)
