"""The project's model and tokenizer loaders: errors that name the path and say why."""
from __future__ import annotations

import pytest

from hybridflow.data import hub_offline, load_causal_lm, load_tokenizer
from hybridflow.errors import ConfigError, ModelLoadError


@pytest.mark.parametrize("loader", [load_tokenizer, load_causal_lm])
def test_missing_local_path_names_the_path(loader, tmp_path):
    missing = tmp_path / "no_such_model"
    with pytest.raises(ModelLoadError, match="no_such_model.*does not exist"):
        loader(str(missing))
    with pytest.raises(ModelLoadError, match="does not exist"):
        loader(missing)  # a Path is never a hub name
    with pytest.raises(ModelLoadError, match=r"'\./models/x' does not exist"):
        loader("./models/x")


@pytest.mark.parametrize("loader", [load_tokenizer, load_causal_lm])
def test_a_file_is_not_a_model_folder(loader, tmp_path):
    f = tmp_path / "config.json"
    f.write_text("{}")
    with pytest.raises(ModelLoadError, match="is a file"):
        loader(str(f))


@pytest.mark.parametrize("loader", [load_tokenizer, load_causal_lm])
def test_hub_name_while_offline_says_the_hub_cannot_be_reached(loader, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert hub_offline()
    with pytest.raises(ModelLoadError, match=r"'hybridflow-test/no-such-model'.*hub cannot be reached.*offline"):
        loader("hybridflow-test/no-such-model")


def test_folder_without_model_files_is_a_load_error(tmp_path):
    with pytest.raises(ModelLoadError, match="holds no model: no config.json"):
        load_causal_lm(tmp_path)


def test_unknown_dtype_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match="unknown dtype 'float99'"):
        load_causal_lm(tmp_path, dtype="float99")
