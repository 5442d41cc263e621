"""Shared by the launcher tests: a warm fork server."""

from __future__ import annotations

import pytest

import guide

from .workers import sum_of_ranks


@pytest.fixture(scope="session")
def warm_fork_server() -> None:
    """Start the fork server once (torch import, ≈2-10 s) so that time budgets measure the launcher,
    not the server's cold start."""
    guide.launch(sum_of_ranks, 2)
