"""The campaign: ``tune --gpu GPU --variant V`` — Optuna ask/tell over Ray compile and GPU tasks.

Public API: ``CampaignOptions`` (what the CLI passes) and ``run_campaign(options) -> exit code``.
"""
from .options import CampaignOptions


def run_campaign(options: CampaignOptions) -> int:
    from .driver import run_campaign as _run  # Ray and Optuna load only when a campaign runs

    return _run(options)


__all__ = ["CampaignOptions", "run_campaign"]
