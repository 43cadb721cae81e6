"""The built-in task's model (no actor_model_name): made once per key, then copied from the cache."""
from __future__ import annotations

import filecmp
from pathlib import Path

import torch

from hybridflow.trainer import setup
from hybridflow.trainer.config import PPOConfig


def _files(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file())


def test_a_cached_model_is_the_one_a_build_makes_and_is_copied_not_rebuilt(tmp_path, monkeypatch):
    monkeypatch.setenv("HYBRIDFLOW_CACHE", str(tmp_path / "cache"))
    config = PPOConfig(seed=3)
    first = Path(setup.actor_source(config, tmp_path / "run1"))
    cached = tmp_path / "cache" / "builtin_models" / setup.builtin_model_key(3)
    assert _files(cached) == _files(first)
    assert not filecmp.cmpfiles(cached, first, _files(first), shallow=False)[1]  # no mismatches

    monkeypatch.setenv("HYBRIDFLOW_CACHE", str(tmp_path / "other_cache"))  # an empty cache: built again
    rebuilt = Path(setup.actor_source(config, tmp_path / "run2"))
    assert not filecmp.cmpfiles(rebuilt, first, _files(first), shallow=False)[1]  # the same bytes: deterministic

    monkeypatch.setenv("HYBRIDFLOW_CACHE", str(tmp_path / "cache"))
    (cached / "marker").write_text("from the cache")
    copied = Path(setup.actor_source(config, tmp_path / "run3"))
    assert (copied / "marker").read_text() == "from the cache"
    assert not (tmp_path / "run3" / "tiny_model.tmp").exists()


def test_the_key_follows_seed_and_threads():
    keys = {setup.builtin_model_key(0), setup.builtin_model_key(1)}
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(threads + 1)
        keys.add(setup.builtin_model_key(0))
    finally:
        torch.set_num_threads(threads)
    assert len(keys) == 3 and setup.builtin_model_key(0) == setup.builtin_model_key(0)


def test_an_unwritable_cache_still_gives_the_model(tmp_path, monkeypatch):
    blocker = tmp_path / "cache"
    blocker.write_text("a file where the cache folder would be")
    monkeypatch.setenv("HYBRIDFLOW_CACHE", str(blocker))
    made = Path(setup.actor_source(PPOConfig(seed=0), tmp_path / "run"))
    assert (made / "config.json").is_file()
