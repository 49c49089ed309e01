"""The measurement library: timing (``timer``), the verification gates (``verify``, ``verify_varlen``,
``verify_decode``), the benchmarks against the libraries (``dense``, ``serving``, ``decode``; their inputs,
workloads and baselines), and the GPU trial every campaign candidate runs (``trial``)."""
