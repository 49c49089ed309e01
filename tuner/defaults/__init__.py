"""A GPU's default kernels without a campaign: the per-bucket defaults table of a profile (``table``) and an export
of those kernels (``export``)."""
