"""``guide.Rank`` and the world size an example asks for: the default, or torchrun's."""

from __future__ import annotations

import pytest

import guide

# Per-test limit here (tighter than pyproject's): slowest measured 23 s (a subprocess that imports
# guide and torch, or a session's first job with the fork server cold; 2 loaded cores).
pytestmark = pytest.mark.timeout(60)

TORCHRUN_ENV = {"RANK": "0", "WORLD_SIZE": "4", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "1"}


@pytest.fixture
def plain_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for key in (*TORCHRUN_ENV, "TORCHELASTIC_RUN_ID"):
        monkeypatch.delenv(key, raising=False)
    return monkeypatch


def test_world_size_is_the_default_outside_torchrun(plain_env: pytest.MonkeyPatch) -> None:
    assert not guide.under_torchrun() and guide.world_size(3) == 3


def test_world_size_is_torchruns_under_torchrun(plain_env: pytest.MonkeyPatch) -> None:
    for key, value in TORCHRUN_ENV.items():
        plain_env.setenv(key, value)
    assert guide.under_torchrun() and guide.world_size(2) == 4


def test_half_a_torchrun_environment_is_not_torchrun(plain_env: pytest.MonkeyPatch) -> None:
    plain_env.setenv("RANK", "0")
    plain_env.setenv("WORLD_SIZE", "4")
    assert not guide.under_torchrun() and guide.world_size(2) == 2


def test_torchelastic_run_id_alone_means_torchrun(plain_env: pytest.MonkeyPatch) -> None:
    plain_env.setenv("TORCHELASTIC_RUN_ID", "x")
    plain_env.setenv("WORLD_SIZE", "8")
    assert guide.under_torchrun() and guide.world_size(2) == 8


def test_rank_zero_is_main() -> None:
    assert guide.Rank(0, 2, "cpu", "gloo").is_main
    assert not guide.Rank(1, 2, "cpu", "gloo").is_main
