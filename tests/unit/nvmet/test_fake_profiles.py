"""The fake's kernel profiles against real captures (attribute sets and defaults)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from nvmet.fake import KERNEL_6_1, KERNEL_6_12, profile_problems

FIXTURES = Path(__file__).parent / "fixtures"


@pytest.mark.parametrize(("capture", "profile"), [("kernel-6.1/profile.json", KERNEL_6_1),
                                                  ("kernel-6.12/profile.json", KERNEL_6_12)])
def test_profile_matches_the_real_capture(capture: str, profile: dict) -> None:
    captured = json.loads((FIXTURES / capture).read_text())
    assert profile_problems(profile, captured) == []


def test_a_wrong_profile_is_caught() -> None:
    captured = json.loads((FIXTURES / "kernel-6.12/profile.json").read_text())
    wrong = {k: dict(v) for k, v in KERNEL_6_12.items()}
    wrong["namespace"]["resv_enable"] = "0"
    wrong["host"]["dhchap_hash"] = "hmac(sha512)"
    del wrong["port"]["addr_tsas"]
    problems = profile_problems(wrong, captured)
    assert any("namespace: resv_enable" in p for p in problems)
    assert any("host dhchap_hash" in p for p in problems)
    assert any("port: addr_tsas" in p for p in problems)
