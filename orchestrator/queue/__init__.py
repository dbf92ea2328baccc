"""What a queue file and a project's gpuq.toml mean: lines, grids, ``[run]``, ``[data]``; imports core and providers.

Parsed once at submit into typed models; every user mistake is one line naming the file and what to do.
"""
