"""GPU hardware profiles: facts as TOML data files beside this module, loaded into frozen dataclasses.

A broken profile file is a ``ProfileError`` naming the file and the field, never a KeyError deep in a
campaign.
"""
from ._loader import (
    ATOM_CATALOGUE,
    Profile,
    ProfileError,
    available_profiles,
    check_fields,
    load_all_profiles,
    load_profile,
    load_profile_file,
    validate_profile_data,
)

__all__ = [
    "ATOM_CATALOGUE",
    "Profile",
    "ProfileError",
    "available_profiles",
    "check_fields",
    "load_all_profiles",
    "load_profile",
    "load_profile_file",
    "validate_profile_data",
]
