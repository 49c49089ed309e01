"""Per-GPU tables of the default kernel's changes per key-length bucket (data; read by tuner/defaults/table.py)."""
