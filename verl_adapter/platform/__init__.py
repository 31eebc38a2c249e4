"""verl as the adapter finds it (docs/verl.md, "The verl internals the plugin reaches"): the host module
(``host``: the verl version, the trainer registry, the checkpoint folders, the legacy trainer's guard), every
patch of verl and vLLM with the internals it relies on (``patches``), code run right after a module is imported
(``after_import``), the legacy trainer's refusals (``legacy_trainer``) and verl's CPU platform (``cpu``).
"""
