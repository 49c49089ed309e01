"""Imported by a trial fork server only (trialproc._preload_main): runs its owner's main script once, as
multiprocessing would in every child, and makes it the server's ``__main__``, so the children skip it."""
import os
from multiprocessing import spawn

from tuner.campaign.trialproc import MAIN_PATH_ENV

_path = os.environ.get(MAIN_PATH_ENV)
if _path and os.path.isfile(_path):
    spawn.import_main_path(_path)
