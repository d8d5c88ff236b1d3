"""Reading a session budget: the forms README documents, and a clear refusal of anything else."""

import pytest

from megakernel_agent.agent.budget import parse_duration


@pytest.mark.parametrize("text, seconds", [("30m", 1800), ("90s", 90), ("1h30m", 5400), ("600", 600),
                                           (" 2H ", 7200), ("0.5", 0.5)])
def test_documented_forms_are_read(text, seconds):
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["10x", "garbage", "1e9h", "-5", "-5m", "0", "0m", "", "m", "1.5h", "9999h"])
def test_anything_else_is_refused(text):
    with pytest.raises(ValueError, match="duration"):
        parse_duration(text)
