"""The ``tune`` command line (``cli``) and one module per sub-command, each a thin shell over the library."""
