"""Values of verl's Hydra config as plain Python, for the core's configs (docs/reference/product.md §1.3)."""

from __future__ import annotations

from omegaconf import DictConfig, ListConfig, OmegaConf


def plain(value):
    """``value`` with every Hydra container resolved into dicts and lists."""
    return (
        OmegaConf.to_container(value, resolve=True) if isinstance(value, DictConfig | ListConfig) else value
    )
