"""Length shaping in verl (docs/reference/length-penalties.md §2, docs/reference/length-coefficient.md §3): the
keys (``config``), TransferQueue rows to the core's ``shape_rollouts`` (``rollouts``), the group filter on
shaped rewards (``filter``), the ``length_grpo`` estimator (``advantage``), the trainer mixin (``trainer``), and
``register``, which puts the mixin in verl's trainer registry when the entry point imports it.
"""
