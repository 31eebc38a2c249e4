"""Entry point of the ``verl.plugins`` group: ``import verl`` imports this module in every process.

verl swallows plugin import errors at debug level, so a failure here is logged at ERROR level with
the traceback, and kept in ``LOAD_ERRORS``, instead of surfacing later as an "unsupported loss mode".
"""

from __future__ import annotations

import importlib
import logging

logger = logging.getLogger("trl_length_plugin")

#: modules whose import registers something with verl
_REGISTERING_MODULES = ("verl_adapter.luspo", "verl_adapter.length_shaping")

LOAD_ERRORS: dict[str, BaseException] = {}

for _name in _REGISTERING_MODULES:
    try:
        importlib.import_module(_name)
    except Exception as err:  # noqa: BLE001 - reported loudly, see module docstring
        LOAD_ERRORS[_name] = err
        logger.error("trl-length-plugin: could not load %s into verl: %r", _name, err, exc_info=True)
