"""Engine adapters: (profile, placement) → argv and environment.

Pure functions, no I/O. :func:`launches.command` is the entry point; each
engine's flags live in its own module (:mod:`.vllm`, :mod:`.sglang`,
:mod:`.llama_cpp`), the fabric environment in :mod:`.nccl`.

Usage::

    from llmgw.engines import launches
    cmd = launches.command(launches.Launch(...))
    cmd.argv, cmd.env
"""
