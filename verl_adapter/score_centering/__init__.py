"""Score centering in verl (docs/reference/score-centering.md §5): the keys against verl's config (``config``),
every verl internal it relies on (``host``), the sampler's heads from the rollout (``rollout``) and the vLLM
server (``server``), the actor's loss (``loss``), the trainer mixin (``trainer``), and ``register``, which
registers them with verl when the entry point imports it.
"""
