import sys
from pathlib import Path

# stub_server.py lives beside the tests; make it importable without a package __init__.
sys.path.insert(0, str(Path(__file__).resolve().parent))
