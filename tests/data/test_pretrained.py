"""The project's model and tokenizer loaders: errors that name the path and say why."""
from __future__ import annotations

import socket

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


@pytest.fixture
def dials(monkeypatch):
    """Every connection (host, port) and name look-up (host, None) this process makes from now on, in order.
    Connections go ahead; look-ups of any name but 127.0.0.1 fail, so no traffic leaves the machine."""
    opened, connect, resolve = [], socket.socket.connect, socket.getaddrinfo

    def connected(sock, address):
        opened.append(tuple(address[:2]) if isinstance(address, tuple) else address)
        return connect(sock, address)

    def resolved(host, *args, **kwargs):
        if host != "127.0.0.1":
            opened.append((host, None))
            raise socket.gaierror(f"test: no name look-up of {host!r}")
        return resolve(host, *args, **kwargs)

    monkeypatch.setattr(socket.socket, "connect", connected)
    monkeypatch.setattr(socket, "getaddrinfo", resolved)
    return opened


@pytest.mark.parametrize("loader", [load_tokenizer, load_causal_lm])
def test_hub_name_while_offline_says_the_hub_cannot_be_reached(loader, monkeypatch, dials):
    from huggingface_hub import constants

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)  # as when the variable is set before the process starts
    assert hub_offline()
    with pytest.raises(ModelLoadError, match=r"'hybridflow-test/no-such-model'.*hub cannot be reached.*offline"):
        loader("hybridflow-test/no-such-model")
    assert dials == []


def test_a_cached_hub_model_loads_without_the_hub_after_one_probe(tmp_path, monkeypatch, dials):
    """The hub refuses connections (a closed port on 127.0.0.1) and the model is in the local cache: it loads
    after one probe of the hub, asking it for no file. (transformers' look-up of a peft adapter config once
    ignored ``local_files_only`` and retried the unreachable hub with back-off for ~20 s.)"""
    from huggingface_hub import constants, file_download

    from hybridflow.data import create_tiny_model_dir, pretrained

    snapshot = tmp_path / "models--hybridflow-test--cached" / "snapshots" / ("0" * 40)
    create_tiny_model_dir(snapshot, hidden=16, layers=1, heads=2)
    (tmp_path / "models--hybridflow-test--cached" / "refs").mkdir()
    (tmp_path / "models--hybridflow-test--cached" / "refs" / "main").write_text("0" * 40)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed once the block ends: nothing listens there
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(constants, "ENDPOINT", f"http://127.0.0.1:{port}")
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path))
    monkeypatch.setattr(pretrained, "_HUB_REACHABLE", {})
    asked, metadata = [], file_download.get_hf_file_metadata
    monkeypatch.setattr(file_download, "get_hf_file_metadata",
                        lambda url, *a, **k: asked.append(url) or metadata(url, *a, **k))
    model = load_causal_lm("hybridflow-test/cached")
    assert model.config.num_hidden_layers == 1
    assert all(d[0] == "127.0.0.1" for d in dials if isinstance(d, tuple)), dials
    assert asked == []  # no file of the model was asked of the hub (each such request retries with back-off)


def test_folder_without_model_files_is_a_load_error(tmp_path):
    with pytest.raises(ModelLoadError, match="holds no model: no config.json"):
        load_causal_lm(tmp_path)


def test_unknown_dtype_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match="unknown dtype 'float99'"):
        load_causal_lm(tmp_path, dtype="float99")
