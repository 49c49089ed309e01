"""The kernel store (``records``: the best verified kernel per GPU architecture, spec and bucket, with its
provenance) and its export to production configs (``export``)."""
