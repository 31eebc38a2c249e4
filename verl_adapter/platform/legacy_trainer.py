"""The legacy ``RayPPOTrainer`` (``trainer.use_v1=false``) has no hook for the plugin's features: importing this
module makes it refuse a config that enables length shaping or score centering instead of silently
training without them (docs/verl.md, "Not supported").

``verl_adapter.plugin`` imports it right after verl imports ``verl.trainer.ppo.ray_trainer``; it imports only
the config readers, not the V1 trainers.
"""

from __future__ import annotations

from verl_adapter.length_shaping.config import shaping_config
from verl_adapter.platform.host import refuse_in_legacy_trainer
from verl_adapter.score_centering.config import score_centering_config

refuse_in_legacy_trainer("length shaping", lambda config: shaping_config(config).enabled)
refuse_in_legacy_trainer("score centering", lambda config: score_centering_config(config).enabled)
