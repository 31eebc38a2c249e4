"""``LengthPluginGRPOTrainer``: TRL's ``GRPOTrainer`` with length shaping and score centering, two mixins
over the same hooks (``length_shaping.LengthShapingMixin``, docs/reference/length-penalties.md §2 and
docs/reference/length-coefficient.md §3; ``score_centering.ScoreCenteringMixin``,
docs/reference/score-centering.md §5), as verl's trainers compose the plugin's two mixins.

The trainer itself only sets up: it checks the TRL host (``_host.py``), runs each feature's checks that need
no model before ``GRPOTrainer.__init__``, builds TRL's colocated engine with the plugin's engine arguments,
then installs each feature; and it writes the model card.
"""

from __future__ import annotations

import logging
import os
from contextlib import contextmanager

from trl import GRPOTrainer

from trl_length_plugin._logging import plugin_log_level
from trl_length_plugin.trl_integration import _host, vllm_topk
from trl_length_plugin.trl_integration.callback import LengthPluginCallback
from trl_length_plugin.trl_integration.config import LengthPluginGRPOConfig
from trl_length_plugin.trl_integration.length_shaping import LengthShapingMixin
from trl_length_plugin.trl_integration.model_card import add_length_control, trainer_card, write_card
from trl_length_plugin.trl_integration.score_centering import ScoreCenteringMixin
from trl_length_plugin.vllm_cpu import keep_plain_cpu_linears


class LengthPluginGRPOTrainer(LengthShapingMixin, ScoreCenteringMixin, GRPOTrainer):
    """``GRPOTrainer`` driven by a ``LengthPluginGRPOConfig``: length shaping and score centering; nothing
    changes when none of their keys is set."""

    _tag_names = [*GRPOTrainer._tag_names, "trl-length-plugin"]

    def __init__(
        self,
        model,
        reward_funcs=None,
        args: LengthPluginGRPOConfig | None = None,
        train_dataset=None,
        eval_dataset=None,
        processing_class=None,
        reward_processing_classes=None,
        callbacks=None,
        **kwargs,
    ):
        _host.check_trl_host()
        if args is None:
            name = model if isinstance(model, str) else model.config._name_or_path
            args = LengthPluginGRPOConfig(f"{name.rstrip('/').split('/')[-1]}-GRPO")
        if not isinstance(args, LengthPluginGRPOConfig):
            raise TypeError(
                "LengthPluginGRPOTrainer needs a LengthPluginGRPOConfig, got " + type(args).__name__
            )
        logging.getLogger("trl_length_plugin").setLevel(plugin_log_level(args))
        if reward_funcs is None:
            funcs = []
        else:
            funcs = list(reward_funcs) if isinstance(reward_funcs, list | tuple) else [reward_funcs]
        # every check that needs no model runs before the model loads
        self._check_length_shaping_inputs(args, funcs, train_dataset, kwargs.get("environment_factory"))
        self._check_score_centering_inputs(model, args, kwargs)
        callbacks = list(callbacks or [])
        if args.length_curves_png:
            callbacks.append(LengthPluginCallback(curves_png=True))
        with self._colocated_engine(args):
            super().__init__(
                model,
                funcs,
                args,
                train_dataset,
                eval_dataset,
                processing_class,
                reward_processing_classes,
                callbacks,
                **kwargs,
            )
        _host.check_trainer_attributes(self)
        self._install_score_centering()
        for callback in self.callback_handler.callbacks:
            if isinstance(callback, LengthPluginCallback):
                callback.bind(self)
        self._install_length_shaping(args)

    # -- setup ------------------------------------------------------------------------------------------
    @contextmanager
    def _colocated_engine(self, args: LengthPluginGRPOConfig):
        """While TRL builds its colocated engine: the plugin's engine arguments (``vllm_engine_kwargs``, the
        logprob cap score centering needs) and, on vLLM's CPU platform, plain linear weights for weight sync."""
        if not (args.use_vllm and args.vllm_mode == "colocate"):
            yield
            return
        _host.check_vllm_host()
        keep_plain_cpu_linears()
        plan = self._score_plan
        extra = vllm_topk.colocate_engine_kwargs(args.vllm_engine_kwargs or {}, plan.top_k if plan else 0)
        with vllm_topk.engine_kwargs(extra):
            yield

    # -- model card -------------------------------------------------------------------------------------
    def create_model_card(self, model_name=None, dataset_name=None, tags=None):
        """TRL's card (tagged ``trl-length-plugin``) with the length-control settings used and the citations
        of every method used (``model_card.py``)."""
        super().create_model_card(model_name=model_name, dataset_name=dataset_name, tags=tags)
        path = os.path.join(self.args.output_dir, "README.md")
        if self.is_world_process_zero() and os.path.exists(path):
            with open(path, encoding="utf-8") as card:
                text = card.read()
            with open(path, "w", encoding="utf-8") as card:
                card.write(add_length_control(text, trainer_card(self.args)))

    def save_model(self, output_dir: str | None = None, _internal_call: bool = False):
        """Save as TRL does, and the model card with it (TRL writes one only with checkpoints)."""
        super().save_model(output_dir, _internal_call)
        if not _internal_call:
            write_card(self, trainer_card(self.args), output_dir)
