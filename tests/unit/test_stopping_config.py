"""The sweep's stopping policy as given: gpuq.toml's [stop] and submit --stop (orchestrator/stopping/config.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.core.errors import ConfigError, UsageError
from orchestrator.stopping.config import load_stop


def _toml(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "gpuq.toml"
    path.write_text(text)
    return path


def test_off_by_default_and_the_flag_wins(tmp_path: Path) -> None:
    assert load_stop(tmp_path / "gpuq.toml") is None
    path = _toml(tmp_path, '[stop]\nrule = "baseline"\nalpha = 0.1\nrungs = [0.2, 0.5]\nmin_seeds = 4\n')
    policy = load_stop(path)
    assert policy is not None and policy.alpha == 0.1 and policy.rungs == (0.2, 0.5) and policy.min_seeds == 4
    assert load_stop(path, "off") is None
    halving = load_stop(path, "halving")
    assert halving is not None and halving.rule == "halving" and halving.alpha == 0.1
    assert "never the baseline" in halving.describe() and "no error bound" in halving.describe()


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ('[stop]\nrule = "baseline"\nalhpa = 0.1\n', "unknown key 'alhpa'"),
        ('[stop]\nrule = "baseline"\nrungs = [0.5, 0.2]\n', "[stop] rungs"),
        ('[stop]\nrule = "fastest"\n', "[stop] rule"),
        ('stop = "baseline"\n', "[stop] must be a table"),
    ],
)
def test_a_bad_table_is_one_line_naming_the_file_and_key(tmp_path: Path, text: str, words: str) -> None:
    path = _toml(tmp_path, text)
    with pytest.raises(ConfigError) as err:
        load_stop(path)
    assert str(path) in str(err.value) and words in str(err.value) and "\n" not in str(err.value)


def test_an_unknown_flag_is_a_usage_error(tmp_path: Path) -> None:
    with pytest.raises(UsageError):
        load_stop(tmp_path / "gpuq.toml", "asha")
