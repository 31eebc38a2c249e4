"""The toy terms of docs/write-a-term.md, each a module that registers its term when imported: the way a
package outside the plugin brings a term (through the ``trl_length_plugin.terms`` entry-point group, or imported
before the length-shaping config is built). ``tests/test_write_a_term.py`` runs ``tests/write_a_term_cases.py``
in fresh interpreters where one of them is registered, importing them as ``toy_terms`` (``tests/`` on the path)."""
