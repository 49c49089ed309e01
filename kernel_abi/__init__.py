"""The facts the compiler (``translate``) and the serving runtime (``tuner.serving``) share, and nothing else:
what a kernel computes (``spec``), how it is called (``abi``: its argument list and version), and the launch rules
a host computes per call (``decode``: the combine grid and the absorbed-MLA layout; ``splits``: the split-KV rule).

Every module here imports the standard library only: the runtime stands on this package without loading the
compiler, and the compiler emits exactly what the runtime launches.
"""
