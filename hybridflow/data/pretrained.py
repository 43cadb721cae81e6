"""The project's loaders of tokenizers and causal LMs: a local folder or a hub name, as in transformers.

Everything hybridflow loads goes through :func:`load_tokenizer` and
:func:`load_causal_lm`, which call transformers' ``from_pretrained`` with the
user's path or hub name unchanged, plus two fixes:

- A local folder with a ``tokenizer.json`` is loaded with ``PreTrainedTokenizerFast``,
  which reads that file faithfully. (transformers 5 ``AutoTokenizer`` on a folder
  whose config says ``qwen2`` builds Qwen's byte-level tokenizer instead of the
  saved one, which loses the spaces of a character-level tokenizer.)
- Failures become :class:`ModelLoadError` naming the path, and saying so when the
  cause is that the hub cannot be reached (offline mode, or no network). Offline
  mode (``HF_HUB_OFFLINE=1`` or ``TRANSFORMERS_OFFLINE=1``) is read when a load is
  made, not only when transformers was imported, so no request is attempted. Otherwise the
  hub's endpoint is probed once (:func:`hub_reachable`): when it cannot be reached, a model in
  the local cache loads from it and any other fails at once, not after a minute of retries.
- A folder without config.json, or with one that transformers / huggingface_hub refuse, is a
  :class:`ModelLoadError` naming the folder (not a page of validation traceback).
"""
from __future__ import annotations

import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from ..errors import ConfigError, ModelLoadError

__all__ = ["load_tokenizer", "load_causal_lm", "hub_offline", "hub_reachable"]

_HUB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*(/[A-Za-z0-9][A-Za-z0-9._-]*)?$")
_TRUE = {"1", "true", "yes", "on"}


def hub_offline() -> bool:
    """Whether the Hugging Face hub must not be contacted (offline mode set in the environment)."""
    if any(os.environ.get(var, "").strip().lower() in _TRUE for var in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")):
        return True
    from huggingface_hub import constants

    return bool(constants.HF_HUB_OFFLINE)


def _local_folder(path_or_name: str | os.PathLike) -> Path | None:
    """The folder to load from, None for a hub name; raises when it can be neither."""
    text = os.fspath(path_or_name)
    path = Path(text).expanduser()
    if path.is_dir():
        return path
    if path.exists():
        raise ModelLoadError(f"{text!r} is a file; give the folder that holds config.json and the weights.")
    looks_like_path = isinstance(path_or_name, os.PathLike) or text.startswith((".", "~", os.sep))
    if looks_like_path or not _HUB_ID.match(text) or ".." in text or "--" in text:
        raise ModelLoadError(
            f"model folder {text!r} does not exist (resolved to {path.resolve()}) and is not a hub name "
            "of the form 'owner/name'; check the path."
        )
    return None


def _is_network_failure(error: BaseException) -> bool:
    seen: BaseException | None = error
    while seen is not None:
        name = type(seen).__name__
        if isinstance(seen, (ConnectionError, TimeoutError)) or "Connect" in name or "Timeout" in name:
            return True
        if "couldn't connect" in str(seen).lower():
            return True
        seen = seen.__cause__ or seen.__context__
    return False


_HUB_REACHABLE: dict[str, bool] = {}


def hub_reachable(timeout: float = 3.0) -> bool:
    """Whether a TCP connection to the hub's endpoint opens within ``timeout`` s; probed once per process and endpoint.

    (Without this, transformers retries for most of a minute before it says that it is offline.)
    """
    import socket
    from urllib.parse import urlparse

    from huggingface_hub import constants

    endpoint = urlparse(constants.ENDPOINT)
    key = f"{endpoint.hostname}:{endpoint.port}"
    if key not in _HUB_REACHABLE:
        port = endpoint.port or (443 if endpoint.scheme == "https" else 80)
        try:
            socket.create_connection((endpoint.hostname, port), timeout=timeout).close()
            _HUB_REACHABLE[key] = True
        except OSError:
            _HUB_REACHABLE[key] = False
    return _HUB_REACHABLE[key]


def _in_cache(name: str) -> bool:
    from huggingface_hub import try_to_load_from_cache

    try:
        return isinstance(try_to_load_from_cache(name, "config.json"), str)
    except Exception:  # a name the cache layout cannot hold
        return False


def _from_hub(what: str, name: str, loader: Callable[..., Any], **kwargs: Any) -> Any:
    offline = hub_offline()
    if not offline and not hub_reachable():
        if not _in_cache(name):
            from huggingface_hub import constants

            raise ModelLoadError(
                f"{name!r} is not a local folder (looked in {Path(name).resolve()}), and the Hugging Face hub "
                f"({constants.ENDPOINT}) cannot be reached from this machine and the {what} is not in the local "
                "cache. Give the path of a model folder, or fetch the model once with network access "
                "(set HF_HUB_OFFLINE=1 to skip this check when working offline).")
        offline = True  # cached: load it without the minute of retries
    if offline:
        kwargs["local_files_only"] = True
        if what == "model":
            # transformers (5.x) looks for a peft adapter_config.json of a hub name without passing
            # local_files_only on, which retries the unreachable hub for about 20 s before giving up
            kwargs["adapter_kwargs"] = {**kwargs.get("adapter_kwargs", {}), "local_files_only": True}
    try:
        return loader(name, **kwargs)
    except (OSError, ValueError) as e:
        missing = f"{name!r} is not a local folder (looked in {Path(name).resolve()})"
        if offline:
            message = (f"{missing}, and the Hugging Face hub cannot be reached: offline mode is on "
                       f"(HF_HUB_OFFLINE / TRANSFORMERS_OFFLINE) and the {what} is not in the local cache. "
                       "Give the path of a model folder, or fetch the model once with network access.")
        elif _is_network_failure(e):
            message = (f"{missing}, and the Hugging Face hub cannot be reached (network failure: {e}). "
                       "Give the path of a model folder, or fetch the model once with network access.")
        else:
            message = f"could not load the {what} {name!r} from the Hugging Face hub: {e}"
        raise ModelLoadError(message) from e


def load_tokenizer(path_or_name: str | os.PathLike, **kwargs: Any):
    """A tokenizer from a local folder or a hub name; ``kwargs`` go to ``from_pretrained``.

    A local folder with ``tokenizer.json`` loads with ``PreTrainedTokenizerFast``
    (faithful to the saved file); anything else with ``AutoTokenizer``.
    """
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    folder = _local_folder(path_or_name)
    if folder is None:
        return _from_hub("tokenizer", os.fspath(path_or_name), AutoTokenizer.from_pretrained, **kwargs)
    _check_model_folder(folder, "tokenizer")
    loader = PreTrainedTokenizerFast if (folder / "tokenizer.json").is_file() else AutoTokenizer
    try:
        return loader.from_pretrained(folder, **kwargs)
    except (OSError, ValueError) as e:
        raise ModelLoadError(f"could not load a tokenizer from folder {str(folder)!r}: {e}") from e
    except Exception as e:  # huggingface_hub validates config fields with its own error types
        raise _bad_config(folder, e) from None


_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json", "vocab.txt")


def _check_model_folder(folder: Path, what: str) -> None:
    """A folder without config.json (and, for a tokenizer, without tokenizer files) is no model: ModelLoadError."""
    has_config = (folder / "config.json").is_file()
    if what == "tokenizer" and (has_config or any((folder / f).is_file() for f in _TOKENIZER_FILES)):
        return
    if what != "tokenizer" and has_config:
        return
    held = sorted(p.name for p in folder.iterdir())[:8]
    raise ModelLoadError(f"model folder {str(folder)!r} holds no {what}: no config.json"
                         f"{' or tokenizer files' if what == 'tokenizer' else ''} (it holds {held or 'nothing'}). "
                         "Give a folder written by save_pretrained (config.json, weights, tokenizer files).")


def _bad_config(folder: Path, err: Exception) -> ModelLoadError:
    """A config.json that transformers / huggingface_hub refuse (a field of the wrong type, ...): one line naming it."""
    first = " ".join(line.strip() for line in str(err).strip().splitlines()[:2])[:300] or type(err).__name__
    return ModelLoadError(f"{folder / 'config.json'} is not a valid model config ({type(err).__name__}: {first}); "
                          "fix that field or rewrite the folder with save_pretrained")


def _as_dtype(dtype: torch.dtype | str) -> torch.dtype | str:
    if isinstance(dtype, torch.dtype) or dtype == "auto":
        return dtype
    resolved = getattr(torch, str(dtype), None)
    if not isinstance(resolved, torch.dtype):
        raise ConfigError(f"unknown dtype {dtype!r}; use e.g. 'float32', 'bfloat16', 'float16' or 'auto'.")
    return resolved


def load_causal_lm(
    path_or_name: str | os.PathLike,
    *,
    dtype: torch.dtype | str | None = None,
    device: str | torch.device | None = None,
    **kwargs: Any,
):
    """A causal LM (``AutoModelForCausalLM``) from a local folder or a hub name.

    Args:
        dtype: weight dtype (``torch.float32``, ``"bfloat16"``, ``"auto"``); None keeps
            transformers' default.
        device: where to move the model after loading (``"cpu"``, ``"cuda:0"``); None leaves it.
        kwargs: passed to ``from_pretrained``.
    """
    from transformers import AutoModelForCausalLM

    if dtype is not None:
        kwargs["dtype"] = _as_dtype(dtype)
    folder = _local_folder(path_or_name)
    if folder is None:
        model = _from_hub("model", os.fspath(path_or_name), AutoModelForCausalLM.from_pretrained, **kwargs)
    else:
        _check_model_folder(folder, "model")
        try:
            model = AutoModelForCausalLM.from_pretrained(folder, **kwargs)
        except (OSError, ValueError) as e:
            raise ModelLoadError(f"could not load a causal LM from folder {str(folder)!r}: {e}") from e
        except (TypeError, KeyError, AttributeError, RuntimeError) as e:
            raise _bad_config(folder, e) from None
        except Exception as e:  # huggingface_hub's StrictDataclassError and kin
            if type(e).__module__.startswith(("huggingface_hub", "transformers")):
                raise _bad_config(folder, e) from None
            raise
    return model.to(device) if device is not None else model
