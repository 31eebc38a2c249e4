"""The verl tools of ``trl-length``: ``verl-check`` (``check``: a run's config checked without Ray or GPUs) and
``verl-smoke`` (``smoke``, with ``smoke_config``, what a CPU run replaces, ``smoke_log``, reading the run, and
``embedded_reward``, the reward of its own data).
"""
