"""Per-GPU tables of the default kernel's changes per key-length bucket (data; read by tuner/bucket_defaults.py)."""
