"""Calibration: the fit reproduces what it was fitted on, presets are untouched, the cache is keyed, a real profile runs."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

import hybridflow.runtime.calibration as calibration
from hybridflow.algorithms import ALGORITHMS
from hybridflow.cli import main
from hybridflow.compiler import ClusterSpec, ModelSpec
from hybridflow.compiler.calibrate import (FITTED_FIELDS, Profile, calibrated_cluster, engine_cost_options, fit_line,
                                          load_level, split_fixed_cost)
from hybridflow.runtime.calibration import cached_profile, calibrate, profile_model, settle_profile
from hybridflow.compiler.cluster import CLUSTER_PRESETS, GIB
from hybridflow.compiler.compile import compile
from hybridflow.compiler.cost import CostOptions, Generate, Infer, Update, estimate
from hybridflow.compiler.layout import Layout
from hybridflow.compiler.memory import OPTIMIZER_STEP_BYTES_PER_PARAM
from hybridflow.errors import ConfigError

TINY = ModelSpec(name="tiny", layers=2, hidden=64, heads=4, kv_heads=2, intermediate=256, vocab=25, qkv_bias=True)
CPU = ClusterSpec(name="cpu", nodes=1, devices_per_node=1, device_memory_bytes=64 * GIB, peak_flops=1e11,
                  memory_bandwidth=2e10, intra_node_bandwidth=2e10, inter_node_bandwidth=1e9, host_bandwidth=2e10)
ONE = Layout(1)
SIZES = (16, 64, 256)
P, R, SPLIT = 8, 4, 4
OVERHEADS = dict(mfu_infer=0.2, mfu_train=0.25, mfu_prefill=0.3, mfu_decode=0.07, forward_overhead_s=1.5e-3,
                 train_micro_batch_overhead_s=4e-3, optimizer_step_overhead_s=2e-3, prefill_overhead_s=3e-4,
                 decode_step_overhead_s=1.4e-3, op_overhead_s=2.5e-4)


def _times(cluster: ClusterSpec, model: ModelSpec = TINY) -> dict:
    """What the cost rules predict for every figure of a profile (the rule side of the fit)."""
    def options(b, micro=None):
        return engine_cost_options(train_micro_batch=micro or b, infer_micro_batch=b)

    return dict(
        forward_s=tuple(estimate(Infer(model, ONE, False, b, P + R), cluster, options(b)).time_s for b in SIZES),
        train_s=tuple(estimate(Update(model, ONE, b, P + R), cluster, options(b)).time_s for b in SIZES),
        train_split_s=estimate(Update(model, ONE, SIZES[-1], P + R), cluster, options(SIZES[-1], SIZES[-1] // SPLIT)).time_s,
        prefill_s=tuple(estimate(Generate(model, ONE, b, P, 1), cluster, options(b)).time_s for b in SIZES),
        generate_s=tuple(estimate(Generate(model, ONE, b, P, R), cluster, options(b)).time_s for b in SIZES))


def _profile(model: ModelSpec = TINY, **times) -> Profile:
    controller = tuple(2.5e-4 + 1e-8 * b * R for b in SIZES)
    return Profile(model=model, source="hand", device="cpu", threads=1, torch_version="x", host="h", prompt_len=P,
                   response_len=R, batch_sizes=SIZES, split_micro_batches=SPLIT, controller_s=controller, **times)


# ------------------------------------------------------------------ the fit
def test_fit_line_is_least_squares_within_its_bounds():
    assert fit_line([1, 2, 3], [3, 5, 7]) == pytest.approx((1, 2))
    # intercept would be negative (-1): the bound a = 0 binds, slope Σxt/Σx² = (1+6+15)/14
    assert fit_line([1, 2, 3], [1, 3, 5]) == pytest.approx((0, 22 / 14))
    # slope 0.5 is below min_slope 1: s = 1 binds, a = mean(t) - mean(x) = 2.5 - 2 = 0.5
    assert fit_line([1, 2, 3], [2, 2.5, 3], min_slope=1.0) == pytest.approx((0.5, 1.0))
    with pytest.raises(ConfigError):
        fit_line([], [])


def test_fit_recovers_the_factors_that_made_exact_measurements():
    truth = CPU.model_copy(update=OVERHEADS)
    fitted = calibrated_cluster(CPU, _profile(**_times(truth)))
    for name in FITTED_FIELDS:
        assert getattr(fitted, name) == pytest.approx(getattr(truth, name), rel=1e-6, abs=1e-12), name
    assert fitted.name == "cpu+calibrated" and fitted.peak_flops == CPU.peak_flops


def test_fitted_rules_reproduce_noisy_measurements_up_to_the_least_squares_residual():
    truth = CPU.model_copy(update=OVERHEADS)
    exact = _times(truth)
    noise = {"forward_s": (1.03, 0.98, 1.01), "train_s": (0.97, 1.02, 1.0), "prefill_s": (1.0, 1.0, 1.0),
             "generate_s": (1.0, 1.0, 1.0)}
    measured = {k: tuple(v * f for v, f in zip(exact[k], noise[k])) if k in noise else v for k, v in exact.items()}
    profile = _profile(**measured)
    predicted = _times(calibrated_cluster(CPU, profile))
    # The tolerance: an unconstrained least-squares line through the measured points (numpy) misses
    # each point by its residual; the fitted rules are that line, so they miss by the same amount.
    n = TINY.flop_params
    for key, flops in (("forward_s", 2 * n * (P + R)), ("train_s", 6 * n * (P + R))):
        x = np.array([flops * b / CPU.peak_flops for b in SIZES])
        t = np.array(measured[key])
        if key == "train_s":
            adam = OPTIMIZER_STEP_BYTES_PER_PARAM * TINY.params / (CPU.memory_bandwidth * CPU.memory_bandwidth_efficiency)
            t = t - adam - (measured["train_split_s"] - measured["train_s"][-1]) / (SPLIT - 1)
        slope, intercept = np.polyfit(x, t, 1)
        residual = np.abs(intercept + slope * x - t)
        assert np.abs(np.array(predicted[key]) - np.array(measured[key])) == pytest.approx(residual, abs=1e-9), key
        assert residual.max() > 1e-5  # the noise is really there
    for key in ("prefill_s", "generate_s"):
        assert predicted[key] == pytest.approx(measured[key], rel=1e-6), key
    # the split update is the largest batch's plus (m - 1) micro-batch overheads: it misses by that batch's residual
    assert predicted["train_split_s"] - measured["train_split_s"] == pytest.approx(
        predicted["train_s"][-1] - measured["train_s"][-1], abs=1e-9)


def test_the_split_update_apportions_the_fixed_cost_of_an_update_and_never_adds_to_it():
    """An update of one micro-batch has 6 ms of fixed cost f: 4 ms per micro-batch (u) + 2 ms per optimizer step (a).
    The split update (4 micro-batches) gives u = (t_split - t) / 3, held within [0, f]."""
    assert split_fixed_cost(6e-3, 4e-3) == pytest.approx((4e-3, 2e-3))
    assert split_fixed_cost(6e-3, 10e-3) == pytest.approx((6e-3, 0.0))  # more than the whole update's fixed cost
    assert split_fixed_cost(6e-3, -1e-3) == pytest.approx((0.0, 6e-3))  # 4 quarters faster than the whole batch
    assert split_fixed_cost(-1e-3, 2e-3) == (0.0, 0.0)


def test_a_slow_split_update_does_not_inflate_the_updates_a_run_prices():
    """The split update measured 30 ms slow (a burst of other work): its estimate of u is 4 + 30/3 = 14 ms, more
    than the 6 ms of fixed cost the single-micro-batch updates show. The fit keeps f = 6 ms and moves it all to u:
    every measured update is still reproduced, and an update priced as the quickstart's (4 mini-batches of one
    micro-batch, two backbone calls each with shared prompts) costs 2·6 = 12 ms of fixed time a step instead of
    2·4 + 2 = 10 ms, 8 ms more over its 4 steps; the fit that took u = 14 ms (a = 0, the line refitted through the
    origin) priced 64 ms more."""
    truth = CPU.model_copy(update=OVERHEADS)
    exact = _times(truth)
    slow = calibrated_cluster(CPU, _profile(**{**exact, "train_split_s": exact["train_split_s"] + 30e-3}))
    assert slow.train_micro_batch_overhead_s == pytest.approx(6e-3, rel=1e-6)
    assert slow.optimizer_step_overhead_s == pytest.approx(0.0, abs=1e-12)
    assert slow.mfu_train == pytest.approx(truth.mfu_train, rel=1e-6)
    assert _times(slow)["train_s"] == pytest.approx(exact["train_s"], rel=1e-9)  # what was measured, reproduced
    update = Update(TINY, ONE, 512, 20, mini_batches=4, prompt_len=16, samples=16)
    options = engine_cost_options(train_micro_batch=128, infer_micro_batch=512)
    shared = dict(estimate(update, truth, options).parts)["overhead"]
    assert shared == pytest.approx(4 * (2 * 4e-3 + 2e-3))  # the rule prices two backbone calls per micro-batch here
    assert estimate(update, slow, options).time_s - estimate(update, truth, options).time_s == pytest.approx(8e-3)


def test_profiles_of_several_models_are_fitted_together():
    truth = CPU.model_copy(update=OVERHEADS)
    wide = ModelSpec(name="wide", layers=2, hidden=128, heads=4, kv_heads=2, intermediate=512, vocab=25, qkv_bias=True)
    fitted = calibrated_cluster(CPU, [_profile(**_times(truth)), _profile(wide, **_times(truth, wide))])
    assert fitted.mfu_train == pytest.approx(truth.mfu_train, rel=1e-6)
    assert fitted.decode_step_overhead_s == pytest.approx(truth.decode_step_overhead_s, rel=1e-6)


# ------------------------------------------------------------------ presets unchanged
def test_presets_have_no_overheads_and_compile_as_before():
    zero = {name: 0.0 for name in FITTED_FIELDS if name.endswith("_s")}
    for preset in CLUSTER_PRESETS.values():
        assert all(getattr(preset, name) == 0.0 for name in zero) and preset.mfu_decode is None
        assert preset.decode_mfu == preset.mfu_infer
    graph = ALGORITHMS["grpo"].build(n=8)
    base = compile(graph, "a100-80g:1", "llama2-7b", placement="colocate")
    explicit = ClusterSpec.parse("a100-80g:1").model_copy(update={**zero, "mfu_decode": 0.5})
    same = compile(graph, explicit, "llama2-7b", placement="colocate", options=CostOptions(shared_prefill=False))
    assert same.predicted_iteration_s == base.predicted_iteration_s
    assert [(o.predicted_start_s, o.predicted_end_s) for o in same.ops] == [(o.predicted_start_s, o.predicted_end_s) for o in base.ops]


def test_overheads_add_per_call_and_shared_prefill_prefills_prompts_once():
    a100 = CLUSTER_PRESETS["a100-80g"]
    options = CostOptions(infer_micro_batch=16, train_micro_batch=4)
    infer = Infer(TINY, ONE, False, 64, 128)
    assert (estimate(infer, a100.model_copy(update={"forward_overhead_s": 0.01}), options).time_s
            == pytest.approx(estimate(infer, a100, options).time_s + 4 * 0.01))  # 64 / 16 = 4 micro-batches
    update = Update(TINY, ONE, 64, 128, epochs=2, mini_batches=2)  # 4 steps of 32 = 8 micro-batches of 4
    busy = a100.model_copy(update={"train_micro_batch_overhead_s": 0.01, "optimizer_step_overhead_s": 0.1})
    assert estimate(update, busy, options).time_s == pytest.approx(estimate(update, a100, options).time_s + 4 * (8 * 0.01 + 0.1))
    gen = Generate(TINY, ONE, 64, 100, 10, samples=16)
    prefill = dict(estimate(gen, a100, CostOptions(shared_prefill=True)).parts)["prefill"]
    assert prefill == pytest.approx(dict(estimate(gen, a100).parts)["prefill"] / 16)


def test_shared_prompt_forward_costs_each_distinct_prompt_once_per_micro_batch():
    """64 rows in groups of 16, 100 prompt + 28 response tokens, micro-batches of 16 (one group each):
    the backbone runs 1 x 100 + 16 x 28 = 548 of 16 x 128 = 2048 positions per micro-batch, in two calls."""
    cpu = CLUSTER_PRESETS["a100-80g"].model_copy(update={"forward_overhead_s": 0.01, "train_micro_batch_overhead_s": 0.02})
    off, on = CostOptions(infer_micro_batch=16, train_micro_batch=16), CostOptions(
        infer_micro_batch=16, train_micro_batch=16, shared_prompt_min_saved=64)
    infer = Infer(TINY, ONE, False, 64, 128, prompt_len=100, samples=16)
    joined, shared = dict(estimate(infer, cpu, off).parts), dict(estimate(infer, cpu, on).parts)
    assert shared["compute"] == pytest.approx(joined["compute"] * 548 / 2048)
    assert (joined["overhead"], shared["overhead"]) == (pytest.approx(4 * 0.01), pytest.approx(4 * 2 * 0.01))
    update = Update(TINY, ONE, 64, 128, prompt_len=100, samples=16)
    joined, shared = dict(estimate(update, cpu, off).parts), dict(estimate(update, cpu, on).parts)
    assert shared["compute"] == pytest.approx(joined["compute"] * 548 / 2048)
    assert shared["overhead"] == pytest.approx(4 * 2 * 0.02)
    # not applied: distinct prompts, a saving under the threshold (15 x 4 = 60 < 64 positions), sharing off
    for work, options in ((Infer(TINY, ONE, False, 64, 128, prompt_len=100, samples=1), on),
                          (Infer(TINY, ONE, False, 64, 8, prompt_len=4, samples=16), on),
                          (Update(TINY, ONE, 64, 128, prompt_len=100, samples=16), off)):
        same = work.__class__(**{**work.__dict__, "prompt_len": 0})
        assert estimate(work, cpu, options).time_s == pytest.approx(estimate(same, cpu, options).time_s)


def test_engine_cost_options_share_prompts_as_the_engines_do():
    from hybridflow.runtime.engines.shared_prompt import MIN_SAVED_POSITIONS

    assert engine_cost_options(8, 8).shared_prompt_min_saved == MIN_SAVED_POSITIONS


@pytest.mark.parametrize("hidden", [64, 100, 256, 1024])
def test_the_cost_model_shares_prompts_where_the_engine_does(hidden):
    # P = 4, groups of 8: a micro-batch of m rows saves (m - m/8) * 4 positions; the engine shares from
    # min_saved_positions(hidden) on (256 at width 64, 164 at 100, 64 at 256, 16 at 1024)
    from hybridflow.compiler.cost import shared_prompt_cost
    from hybridflow.runtime.engines.shared_prompt import min_saved_positions

    options = engine_cost_options(8, 8)
    for micro in range(8, 129, 8):
        saved = (micro - micro // 8) * 4
        calls = shared_prompt_cost(micro, 12, 4, 8, hidden, options)[1]
        assert (calls == 2) == (saved >= min_saved_positions(hidden)), (micro, saved)


# ------------------------------------------------------------------ the cache
def _model_dir(tmp_path, hidden=64):
    folder = tmp_path / f"model{hidden}"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({
        "model_type": "qwen2", "hidden_size": hidden, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 2, "intermediate_size": 4 * hidden, "vocab_size": 25, "_name_or_path": str(folder)}))
    return folder


@pytest.fixture
def fake_profiler(monkeypatch, tmp_path):
    """profile_model replaced by a hand-made profile; counts the folders it measured."""
    calls = []
    exact = _times(CPU.model_copy(update=OVERHEADS))

    def fake(model, device="cpu", threads=None, **settings):
        calls.append((str(model), threads))
        return _profile(**exact).model_copy(update={"threads": threads, "source": str(model)})

    monkeypatch.setenv("HYBRIDFLOW_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(calibration, "profile_model", fake)
    return calls


def test_cache_round_trips_and_is_keyed_by_threads(tmp_path, fake_profiler):
    model = _model_dir(tmp_path)
    first, cached = cached_profile(model, threads=1, busy=0.0)
    assert not cached and len(list((tmp_path / "cache" / "calibration").glob("*.json"))) == 1
    again, cached = cached_profile(model, threads=1, busy=0.0)
    assert cached and again == first and len(fake_profiler) == 1
    _, cached = cached_profile(model, threads=2, busy=0.0)  # another thread count: another key
    assert not cached and len(fake_profiler) == 2
    _, cached = cached_profile(model, threads=1, cache=False, busy=0.0)
    assert not cached and len(fake_profiler) == 3


def test_a_load_level_without_a_profile_borrows_the_nearest_until_the_drift_check_says_otherwise(tmp_path, fake_profiler):
    model = _model_dir(tmp_path)
    first, _ = cached_profile(model, threads=1, busy=1.6)  # measured beside a neighbour using 1.6 cores
    assert first.busy_cores == 1.6 and first.used_at_level is None and first.cache_key
    _, cached = cached_profile(model, threads=1, busy=1.8)  # the same level (2 cores busy): its own
    assert cached and len(fake_profiler) == 1
    borrowed, cached = cached_profile(model, threads=1, busy=0.1)  # idle: level 2's profile, marked for the check
    assert cached and len(fake_profiler) == 1 and borrowed.used_at_level == 0 and borrowed.busy_cores == 1.6
    assert "does not hold at level 0" in settle_profile(borrowed, drifted=True)
    idle, cached = cached_profile(model, threads=1, busy=0.0)  # drifted here: level 0 measures its own
    assert not cached and len(fake_profiler) == 2 and idle.busy_cores == 0.0 and idle.used_at_level is None
    _, cached = cached_profile(model, threads=1, busy=0.2)
    assert cached and len(fake_profiler) == 2
    again, cached = cached_profile(model, threads=1, busy=1.7)  # the neighbour is back: its profile is still there
    assert cached and again == first and len(fake_profiler) == 2


def test_a_borrowed_profile_that_holds_is_kept_for_the_level_and_one_that_drifts_at_home_is_dropped(tmp_path, fake_profiler):
    model = _model_dir(tmp_path)
    cached_profile(model, threads=1, busy=2.0)
    borrowed, _ = cached_profile(model, threads=1, busy=1.0)
    assert borrowed.used_at_level == 1 and "holds at level 1" in settle_profile(borrowed, drifted=False)
    own, cached = cached_profile(model, threads=1, busy=1.0)  # now level 1's own: no further check needed
    assert cached and own.used_at_level is None and settle_profile(own, drifted=False) is None
    assert "dropped" in settle_profile(own, drifted=True)
    _, cached = cached_profile(model, threads=1, busy=1.0)  # measured again, not borrowed from level 2 again
    assert not cached and len(fake_profiler) == 2
    assert settle_profile(_profile(**_times(CPU)), drifted=True) is None  # a profile that never went through the cache


def test_a_neighbour_that_starts_while_profiling_is_recorded_and_an_idle_run_checks_it(tmp_path, monkeypatch):
    """The load check before profiling saw an idle machine, but a neighbour used a core while the profile ran
    (runs started together): the profile is stored as one of the higher load, and an idle run later only borrows it
    (for its drift check), never takes it for its own level's."""
    if not os.path.exists("/proc/stat"):
        pytest.skip("no /proc/stat: the load while profiling cannot be measured")
    calls = []
    exact = _times(CPU.model_copy(update=OVERHEADS))

    def beside_a_neighbour(model, device="cpu", threads=None, **settings):
        calls.append(model)
        spin = "import time\nend = time.process_time() + 1.0\nwhile time.process_time() < end: pass"
        subprocess.run([sys.executable, "-c", spin], check=True)  # one core busy for 1 s of its own CPU time
        return _profile(**exact).model_copy(update={"threads": threads, "source": str(model)})

    monkeypatch.setenv("HYBRIDFLOW_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(calibration, "profile_model", beside_a_neighbour)
    model = _model_dir(tmp_path)
    loaded, cached = cached_profile(model, threads=1, busy=0.0)
    assert not cached and loaded.busy_cores >= 0.6
    borrowed, cached = cached_profile(model, threads=1, busy=0.0)  # idle now: borrowed, to be checked
    assert cached and borrowed.used_at_level == 0 and len(calls) == 1
    settle_profile(borrowed, drifted=True)
    _, cached = cached_profile(model, threads=1, busy=0.0)
    assert not cached and len(calls) == 2


def test_load_levels_are_whole_cores_capped_at_the_core_count():
    assert [load_level(b, cores=2) for b in (0.0, 0.49, 0.5, 1.2, 1.6, 8.0, 30.0)] == [0, 0, 1, 1, 2, 2, 2]
    assert load_level(2.7, cores=4) == 3 and load_level(-0.1, cores=4) == 0


def test_calibrate_profiles_each_folder_once_and_skips_rule_roles(tmp_path, fake_profiler):
    model, other = _model_dir(tmp_path), _model_dir(tmp_path, hidden=32)
    cluster = calibrate(CPU, {"actor": model, "ref": str(model), "critic": other, "reward": None, "cost": "rule"}, threads=1)
    assert sorted(c[0] for c in fake_profiler) == sorted([str(model.resolve()), str(other.resolve())])
    assert cluster.mfu_decode == pytest.approx(OVERHEADS["mfu_decode"], rel=1e-6)
    with pytest.raises(ConfigError, match="role 'actor'"):
        calibrate(CPU, {"actor": tmp_path / "missing"})
    with pytest.raises(ConfigError, match="no role"):
        calibrate(CPU, {"reward": None})


# ------------------------------------------------------------------ a real profile
def test_real_profile_of_the_tiny_model_and_the_command(tmp_path, monkeypatch, capsys):
    from hybridflow.data import create_tiny_model_dir

    monkeypatch.setenv("HYBRIDFLOW_CACHE", str(tmp_path / "cache"))
    folder = create_tiny_model_dir(tmp_path / "tiny", task="arithmetic", seed=0, hidden=64, layers=2, heads=4, kv_heads=2)
    profile = profile_model(folder, threads=1, batch_sizes=(4, 16), repeats=3)  # medians: the suite loads the machine
    assert profile.model.params == 126_656 and profile.threads == 1
    assert all(t > 0 for t in profile.forward_s + profile.train_s + profile.prefill_s + profile.generate_s)
    # one prefill and one R-token generation per batch size (which is longer is the machine's business: a busy
    # machine has measured a prefill slower than a generation)
    assert len(profile.prefill_s) == len(profile.generate_s) == len(profile.batch_sizes) == 2
    fitted = calibrated_cluster(ClusterSpec.preset("cpu-local"), profile)
    assert all(0 < getattr(fitted, f) <= 1 for f in FITTED_FIELDS if f.startswith("mfu"))
    assert main(["profile", "--model", str(folder), "--threads", "1"]) == 0
    out = capsys.readouterr().out
    assert "measured in" in out and "decode_step_overhead_s" in out and "cpu-local+calibrated" in out
    # another folder of the same config reads that profile from the cache, under its own name (asked at the load level
    # the profile was stored under: a neighbour that started while it was measured raises that level)
    twin = create_tiny_model_dir(tmp_path / "twin", task="arithmetic", seed=1, hidden=64, layers=2, heads=4, kv_heads=2)
    first, _ = cached_profile(folder, threads=1, busy=0.0, batch_sizes=(4,), repeats=1)
    again, cached = cached_profile(twin, threads=1, busy=first.busy_cores, batch_sizes=(4,), repeats=1)
    assert cached and again.source == str(twin) and first.source == str(folder)
    assert again.forward_s == first.forward_s  # the stored measurement, not a new one
