"""The tools that drive a host end to end: ``trl-length`` (``commands``, one subcommand per tool), the demo
(``demo``: GRPO with TRL on the embedded task) and the recipe smoke run (``recipe_smoke``: every TRL recipe one
step on CPU). They may import any host; nothing of the core or a host imports them.
"""
