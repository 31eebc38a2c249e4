"""Offline tools on saved rollouts (docs/profiles.md): ``trl-length profile`` builds the per-prompt
metadata of docs/reference/length-penalties.md §2.14 from a reference model's rollouts, and
``trl-length preview`` shows what a length-shaping config does to saved rollouts, with the training step's
own ``shape_rollouts``.

- ``rollouts``: the rollout file format, read one row at a time (JSONL, CSV, Parquet, ``datasets`` dirs).
- ``tables``: prompt datasets and output files.
- ``outputs``: every output's checks (never an input, replaced only with ``--overwrite``) and its write
  through a temporary file renamed at the end.
- ``profiles``: per-prompt profiles and bands from the rollouts' numbers.
- ``generate``: rollouts sampled with transformers (the embedded model) or vLLM.
- ``preview``: one shaping step on saved rollouts and its summary; ``plot``: the preview PNG.
- ``profile_cli`` / ``preview_cli``: the two subcommands (``main(argv)``); ``command``: their error
  convention.
"""
