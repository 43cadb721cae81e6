"""Rule rewards: a user's ``compute_score`` function applied to every decoded response.

The function has the signature common in this field::

    compute_score(data_source, solution_str, ground_truth, extra_info=None) -> float | dict

A float (or int, bool, numpy or one-element torch scalar) is the score. A dict must
hold the score under ``"score"``; its other keys are kept as per-sample extras
(a sample that lacks a key gets None there). A NaN, an infinite or a
non-numeric score, a dict without ``"score"``, an exception inside the
function, or a call that takes longer than ``timeout_s`` raises
:class:`~hybridflow.errors.RewardError` naming the sample index and its data source.

With a ``timeout_s`` the function runs on a daemon thread of the source, a batch at a time (one hand-over
per batch, not per response), and the caller checks every ``POLL_S`` how long the running call has
taken: a call past the limit is abandoned (a daemon thread never keeps the process alive) and the
next batch gets a fresh thread.
"""
from __future__ import annotations

import inspect
import math
import numbers
import queue
import threading
import time
from typing import Any, Callable, NamedTuple, Sequence

import torch

from hybridflow.errors import BatchError, RewardError

__all__ = ["RewardOutput", "RuleRewardSource"]


class RewardOutput(NamedTuple):
    scores: torch.Tensor
    """``(b,)`` float32, one score per response."""
    extras: dict[str, list]
    """Per-sample extra values by name (each a list of length b); empty when there are none."""


def _column(batch, name: str, size: int, *, required: bool = True) -> list:
    try:
        values = batch[name]
    except (KeyError, LookupError, BatchError):
        if not required:
            return [None] * size
        raise RewardError(f"the rule reward needs the batch column {name!r}, which the batch lacks; "
                          "datasets provide prompt, ground_truth, data_source (and optional extra_info)") from None
    values = values.tolist() if isinstance(values, torch.Tensor) else list(values)
    if len(values) != size:
        raise RewardError(f"batch column {name!r} has {len(values)} entries for {size} responses")
    return values


def _passes_extra_info(fn: Callable) -> bool:
    """Whether ``fn`` takes a fourth (extra_info) argument."""
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return True
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    return len(positional) >= 4 or any(p.kind is p.VAR_POSITIONAL for p in params)


def _as_score(value: Any, index: int, data_source: Any) -> float:
    where = f"sample {index} (data_source={data_source!r})"
    if isinstance(value, torch.Tensor) and value.numel() == 1:
        value = value.item()
    if not isinstance(value, numbers.Real):  # bool is an int, so True/False count as 1/0
        raise RewardError(f"compute_score returned a non-numeric score {value!r} for {where}; return a float or "
                          "a dict with a float under 'score'")
    score = float(value)
    if not math.isfinite(score):
        raise RewardError(f"compute_score returned {score} for {where}; scores must be finite numbers")
    return score


class RuleRewardSource:
    """Scores responses with a ``compute_score`` function.

    Args:
        compute_score: ``(data_source, solution_str, ground_truth, extra_info=None) -> float | dict``.
        tokenizer: decodes ``response_ids`` when the batch has no ``responses`` text column.
        eos_token_ids: EOS ids, used with ``unfinished_score`` and when decoding.
        unfinished_score: when set, a response that did not end with EOS (cut at
            max_new_tokens) gets this score without calling ``compute_score``.
        timeout_s: longest one ``compute_score`` call may take; None: no limit (called on the caller's thread).
    """

    def __init__(self, compute_score: Callable[..., Any], *, tokenizer=None, eos_token_ids: Sequence[int] = (),
                 unfinished_score: float | None = None, timeout_s: float | None = None):
        if timeout_s is not None and not timeout_s > 0:
            raise RewardError(f"timeout_s must be a positive number of seconds or None, got {timeout_s!r}")
        self.timeout_s = timeout_s
        self._worker: _CallThread | None = None
        if not callable(compute_score):
            raise RewardError(f"compute_score must be callable, got {type(compute_score).__name__}")
        if unfinished_score is not None and not eos_token_ids:
            raise RewardError("unfinished_score needs eos_token_ids to tell finished responses from cut ones")
        self.compute_score = compute_score
        self.tokenizer = tokenizer
        self.eos_token_ids = tuple(int(i) for i in eos_token_ids)
        self.unfinished_score = unfinished_score
        self._with_extra_info = _passes_extra_info(compute_score)

    def _responses(self, batch, size: int) -> list[str]:
        try:
            return _column(batch, "responses", size)
        except RewardError:
            if self.tokenizer is None:
                raise RewardError("the batch has no 'responses' text column and the RuleRewardSource has no "
                                  "tokenizer to decode response_ids; pass tokenizer=...") from None
        from .text import decode_responses

        return decode_responses(self.tokenizer, batch["response_ids"], batch["response_mask"], self.eos_token_ids)

    def _finished(self, batch, size: int) -> list[bool]:
        if self.unfinished_score is None:
            return [True] * size
        from .text import ends_with_eos

        return ends_with_eos(batch["response_ids"], batch["response_mask"], self.eos_token_ids).tolist()

    def _results(self, calls: list[tuple[int, Any, tuple]]) -> list[Any]:
        """``compute_score(*args)`` of each ``(index, data_source, args)``, in order; RewardError naming the sample
        whose call raised or (with ``timeout_s``) did not return in time. With a time limit the calls run on the
        source's thread, one batch per hand-over (a hand-over per call cost ~50 us each)."""
        if self.timeout_s is None:
            out = []
            for index, source, args in calls:
                try:
                    out.append(self.compute_score(*args))
                except Exception as err:  # a user function: report which sample broke it
                    raise self._failed(index, source, err) from err
            return out
        if self._worker is None:
            self._worker = _CallThread()
        try:
            return self._worker.run_all(self.compute_score, [args for _, _, args in calls], self.timeout_s)
        except _CallTimeout as late:
            self._worker = None  # still inside the call that hangs: abandoned
            index, source, _ = calls[late.position]
            raise RewardError(f"compute_score did not return within reward_timeout_s={self.timeout_s:g} s on sample "
                              f"{index} (data_source={source!r}); it may loop or wait for ever. Fix the function, "
                              "or raise reward_timeout_s if it is just slow") from None
        except _CallFailed as failed:
            index, source, _ = calls[failed.position]
            raise self._failed(index, source, failed.error) from failed.error

    def _failed(self, index: int, source, err: BaseException) -> RewardError:
        hint = ""
        if "main thread" in str(err):  # signals (e.g. signal.alarm for its own time limit) work in the main thread only
            if threading.current_thread() is not threading.main_thread():
                hint = ("; it uses signals (e.g. signal.alarm for its own time limit), which work only in a process's "
                        "main thread, and this process runs its ops on another (a Ray worker does): drop them, and "
                        "bound its time with reward_timeout_s")
            elif self.timeout_s is not None:
                hint = ("; it uses signals (e.g. signal.alarm for its own time limit), which work only in the main "
                        "thread: set reward_timeout_s=null to call it there (without hybridflow's time limit)")
        return RewardError(f"compute_score failed on sample {index} (data_source={source!r}): "
                           f"{type(err).__name__}: {err}{hint}")

    def score(self, batch) -> RewardOutput:
        """Scores ``(b,)`` float32 of every response in ``batch``, and the dict results' extra keys."""
        size = len(batch["response_ids"])
        responses = self._responses(batch, size)
        sources = _column(batch, "data_source", size)
        truths = _column(batch, "ground_truth", size)
        infos = _column(batch, "extra_info", size, required=False)
        finished = self._finished(batch, size)
        calls = [(i, sources[i], (sources[i], responses[i], truths[i]) + ((infos[i],) if self._with_extra_info else ()))
                 for i in range(size) if finished[i]]
        results = iter(self._results(calls))
        scores, extras = [], []
        for i in range(size):
            if not finished[i]:
                scores.append(float(self.unfinished_score))
                extras.append({})
                continue
            result = next(results)
            if isinstance(result, dict):
                if "score" not in result:
                    raise RewardError(f"compute_score returned a dict without 'score' for sample {i} "
                                      f"(data_source={sources[i]!r}); its keys are {sorted(result)}")
                extras.append({k: v for k, v in result.items() if k != "score"})
                result = result["score"]
            else:
                extras.append({})
            scores.append(_as_score(result, i, sources[i]))
        names = list(dict.fromkeys(k for e in extras for k in e))
        return RewardOutput(torch.tensor(scores, dtype=torch.float32), {k: [e.get(k) for e in extras] for k in names})


class _CallTimeout(Exception):
    def __init__(self, position: int):
        self.position = position


class _CallFailed(Exception):
    def __init__(self, position: int, error: BaseException):
        self.position, self.error = position, error


POLL_S = 0.25
"""How often the caller checks the running call's age: a call past its limit is named at most this late."""


class _CallThread:
    """A daemon thread that runs the batches of calls it is given, one call at a time, noting when each started;
    :meth:`run_all` waits for a batch and names the first call that raised or ran past its time limit."""

    def __init__(self):
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._started: tuple[int, float] | None = None
        threading.Thread(target=self._serve, name="hybridflow-reward", daemon=True).start()

    def _serve(self) -> None:
        while True:
            fn, calls, results, done = self._jobs.get()
            for position, args in enumerate(calls):
                self._started = (position, time.monotonic())
                try:
                    results.append(fn(*args))
                except BaseException as err:  # handed to the caller, which raises it
                    results.append(_CallFailed(position, err))
                    break
            self._started = None
            done.set()

    def run_all(self, fn: Callable[..., Any], calls: list[tuple], timeout_s: float) -> list[Any]:
        """``[fn(*args) for args in calls]`` on the thread; _CallFailed or _CallTimeout naming the call's position."""
        results: list[Any] = []
        done = threading.Event()
        self._jobs.put((fn, calls, results, done))
        while not done.wait(min(timeout_s, POLL_S)):
            started = self._started
            if started is not None and time.monotonic() - started[1] > timeout_s:
                raise _CallTimeout(started[0])
        if results and isinstance(results[-1], _CallFailed):
            raise results[-1]
        return results
