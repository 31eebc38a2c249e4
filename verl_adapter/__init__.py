"""verl integration of trl-length-plugin (docs/reference/product.md §1.1).

Loaded by verl through the ``verl.plugins`` entry point (``verl_adapter.plugin``). It imports the
framework-free core of ``trl_length_plugin``, never its TRL integration.
"""
