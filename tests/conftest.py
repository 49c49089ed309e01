# pytest puts this folder on sys.path (no __init__.py here), so tests in subfolders can import the
# shared helpers beside this file, e.g. `from sketch_edits import moved_prefetch`.
