"""Quick calibration: shallow copies extrapolated to the model's depth, batch sizes sized to the model, the drift
check of the first steps, and a run that checks its calibration."""
from __future__ import annotations

import json

import pytest

from hybridflow.algorithms import ALGORITHMS
from hybridflow.compiler import ClusterSpec, ModelSpec, compile_for
from hybridflow.compiler.calibrate import FITTED_FIELDS, calibrated_cluster, engine_cost_options, load_level
from hybridflow.compiler.cluster import GIB
from hybridflow.compiler.cost import Generate, Infer, Update, estimate
from hybridflow.compiler.layout import Layout
from hybridflow.compiler.passes import BatchShape
from hybridflow.compiler.profiling import Profile
from hybridflow.errors import ConfigError
from hybridflow.runtime.calibration import (QUICK_BUDGET, cached_profile, extrapolate, extrapolate_figures,
                                            profile_model, profile_settings, quick_settings, settle_profile,
                                            with_layers)
from hybridflow.runtime.spans import Span
from hybridflow.trainer.calibration_check import CHECK_STEPS, check_calibration, drift_check

CPU = ClusterSpec(name="cpu", nodes=1, devices_per_node=1, device_memory_bytes=64 * GIB, peak_flops=1e11,
                  memory_bandwidth=2e10, intra_node_bandwidth=2e10, inter_node_bandwidth=1e9, host_bandwidth=2e10,
                  mfu_infer=0.2, mfu_train=0.25, mfu_prefill=0.3, mfu_decode=0.07, forward_overhead_s=1.5e-3,
                  train_micro_batch_overhead_s=4e-3, optimizer_step_overhead_s=2e-3, prefill_overhead_s=3e-4,
                  decode_step_overhead_s=1.4e-3, op_overhead_s=2.5e-4)
SIZES, P, R, SPLIT = (2, 8, 32), 8, 4, 4
ONE = Layout(1)


def _model(layers: int) -> ModelSpec:
    """The ~8M bench model's shape at ``layers`` blocks."""
    return ModelSpec(name=f"m{layers}", layers=layers, hidden=256, heads=8, kv_heads=4, intermediate=1024, vocab=25,
                     qkv_bias=True)


def _rule_profile(model: ModelSpec) -> Profile:
    """A profile whose figures are what the cost rules price for ``model`` on CPU (a FLOP-count model of it)."""
    def opts(b, micro=None):
        return engine_cost_options(train_micro_batch=micro or b, infer_micro_batch=b)

    return Profile(
        model=model, source="rules", device="cpu", threads=1, torch_version="x", host="h", prompt_len=P, response_len=R,
        batch_sizes=SIZES, split_micro_batches=SPLIT, controller_s=tuple(2.5e-4 + 1e-8 * b * R for b in SIZES),
        forward_s=tuple(estimate(Infer(model, ONE, False, b, P + R), CPU, opts(b)).time_s for b in SIZES),
        train_s=tuple(estimate(Update(model, ONE, b, P + R), CPU, opts(b)).time_s for b in SIZES),
        train_split_s=estimate(Update(model, ONE, SIZES[-1], P + R), CPU, opts(SIZES[-1], SIZES[-1] // SPLIT)).time_s,
        prefill_s=tuple(estimate(Generate(model, ONE, b, P, 1), CPU, opts(b)).time_s for b in SIZES),
        generate_s=tuple(estimate(Generate(model, ONE, b, P, R), CPU, opts(b)).time_s for b in SIZES))


FIGURES = ("forward_s", "train_s", "prefill_s", "generate_s")


def test_extrapolating_one_and_two_layers_reproduces_the_whole_models_flop_count_model():
    """Under the cost rules every figure is a fixed part plus a part per layer, so the 8-layer figures follow from
    the 1- and 2-layer ones (up to rounding), and so does the calibration fitted to them."""
    one, two, whole = (_rule_profile(_model(n)) for n in (1, 2, 8))
    for name in FIGURES:
        scaled = [extrapolate(a, b, (1, 2), 8) for a, b in zip(getattr(one, name), getattr(two, name))]
        assert scaled == pytest.approx(getattr(whole, name), rel=1e-9), name
        # and the scaling is not the identity: the whole model takes several times the one-layer copy
        assert all(w > 3 * a for w, a in zip(getattr(whole, name), getattr(one, name))), name
    split = extrapolate(one.train_split_s, two.train_split_s, (1, 2), 8)
    assert split == pytest.approx(whole.train_split_s, rel=1e-9)


def test_extrapolate_is_linear_in_layers_and_never_lets_a_layer_save_time():
    assert extrapolate(1.0, 1.5, (1, 2), 8) == pytest.approx(1.0 + 7 * 0.5)
    assert extrapolate(1.0, 2.0, (1, 3), 5) == pytest.approx(1.0 + 4 * 0.5)
    assert extrapolate(1.0, 0.9, (1, 2), 8) == 1.0  # noise made the deeper copy faster: no negative layer time


def _synthetic(depth: int, split_slow_s: float = 0.0) -> dict:
    """(depth measured at, figure, batch size) -> seconds of a model ``depth`` layers deep whose every figure is a
    fixed part (embedding, head, sampling, per-call costs: large, as in a small model) plus ``depth`` times a
    per-layer part, each growing with the batch; the controller's GAE call has no layers."""
    fixed = {"forward": 3e-3, "train": 40e-3, "prefill": 2e-3, "generate": 6e-3}
    layer = {"forward": 4e-4, "train": 1.2e-3, "prefill": 3e-4, "generate": 9e-4}
    times = {}
    for b in SIZES:
        for kind in fixed:
            times[(depth, kind, b)] = (fixed[kind] + depth * layer[kind]) * (1 + b / 2)
        times[(None, "controller", b)] = 2.5e-4 + 1e-8 * b * R
    # the same rows in SPLIT micro-batches: each further one adds its fixed cost, 1 ms + 0.2 ms a layer
    further = (SPLIT - 1) * (1e-3 + depth * 2e-4)
    times[(depth, "split", SIZES[-1])] = times[(depth, "train", SIZES[-1])] + further + split_slow_s
    return times


def _profile_of(times: dict, model: ModelSpec) -> Profile:
    """The profile profile_model would return for (figure, batch size) -> seconds ``times``."""
    def per_size(kind):
        return tuple(times[(kind, b)] for b in SIZES)

    return Profile(model=model, source="synthetic", device="cpu", threads=1, torch_version="x", host="h", prompt_len=P,
                   response_len=R, batch_sizes=SIZES, split_micro_batches=SPLIT, forward_s=per_size("forward"),
                   train_s=per_size("train"), train_split_s=times[("split", SIZES[-1])], prefill_s=per_size("prefill"),
                   generate_s=per_size("generate"), controller_s=per_size("controller"))


@pytest.mark.parametrize("split_slow_s", [0.0, 0.2])
def test_the_quick_profile_of_synthetic_per_layer_times_is_the_whole_models_and_fits_the_same(split_slow_s):
    """Hand-worked: 5 ms at one layer and 7 ms at two is 3 ms of fixed cost and 2 ms a layer, so 3 + 8·2 = 19 ms at
    eight: the fixed cost is counted once, not once a layer. With every figure made that way the 1- and 2-layer
    measurements extrapolate to the 8-layer ones exactly, and the cluster fitted to them is the one fitted to the
    whole model's (also when the split update is 0.2 s slow at every depth: noise the fit bounds, not the scaling)."""
    assert extrapolate(5e-3, 7e-3, (1, 2), 8) == pytest.approx(19e-3)
    measured = {(1, "train", 4): 5e-3, (2, "train", 4): 7e-3, (None, "controller", 4): 1e-4}
    assert extrapolate_figures(measured, (1, 2), 8) == pytest.approx({("train", 4): 19e-3, ("controller", 4): 1e-4})
    model = _model(8)
    shallow = {**_synthetic(1, split_slow_s), **_synthetic(2, split_slow_s)}
    whole = {(None, kind, b): t for (_, kind, b), t in _synthetic(8, split_slow_s).items()}
    quick = extrapolate_figures(shallow, (1, 2), 8)
    assert quick == pytest.approx(extrapolate_figures(whole, None, 8), rel=1e-12)
    assert quick[("train", SIZES[0])] < 2 * shallow[(1, "train", SIZES[0])]  # fixed costs dominate: not 8x one layer
    quick_fit, whole_fit = (calibrated_cluster(CPU, _profile_of(t, model))
                            for t in (quick, extrapolate_figures(whole, None, 8)))
    for name in FITTED_FIELDS:
        assert getattr(quick_fit, name) == pytest.approx(getattr(whole_fit, name), rel=1e-9, abs=1e-15), name
    assert quick_fit.forward_overhead_s > 0
    if not split_slow_s:  # 1 ms + 8 x 0.2 ms per further micro-batch, recovered through the extrapolation
        assert quick_fit.train_micro_batch_overhead_s == pytest.approx(2.6e-3, rel=1e-9)
        assert quick_fit.optimizer_step_overhead_s > 0
    else:  # the whole fixed cost of an update (what u + a is without the slow split), no more
        steady = calibrated_cluster(CPU, _profile_of(extrapolate_figures(
            {**_synthetic(1), **_synthetic(2)}, (1, 2), 8), model))
        assert quick_fit.train_micro_batch_overhead_s == pytest.approx(
            steady.train_micro_batch_overhead_s + steady.optimizer_step_overhead_s, rel=1e-9)
        assert quick_fit.optimizer_step_overhead_s == 0 and quick_fit.mfu_train == pytest.approx(steady.mfu_train)


def test_quick_settings_size_the_batches_to_the_measured_depth():
    tiny = {"model_type": "qwen2", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
            "num_key_value_heads": 2, "intermediate_size": 256, "vocab_size": 25}
    assert quick_settings(tiny) == {"batch_sizes": (32, 128, 512), "depths": None}  # no deeper than the copies
    ten = {**tiny, "hidden_size": 256, "num_hidden_layers": 8, "num_attention_heads": 8, "num_key_value_heads": 4,
           "intermediate_size": 1024, "layer_types": ["full_attention"] * 8}
    settings = quick_settings(ten)
    assert settings["depths"] == (1, 2)
    largest = settings["batch_sizes"][-1]
    flop_params = ModelSpec.from_config(with_layers(ten, 2)).flop_params
    assert largest * 12 * flop_params <= QUICK_BUDGET < 2 * largest * 12 * flop_params
    assert settings["batch_sizes"] == (largest // 16, largest // 4, largest)
    assert with_layers(ten, 2)["layer_types"] == ["full_attention"] * 2 and ten["num_hidden_layers"] == 8
    full = profile_settings(ten, quick=False)
    assert full["batch_sizes"] == (16, 128, 512) and "depths" not in full
    assert profile_settings(ten, batch_sizes=(4,))["batch_sizes"] == (4,)


def test_a_real_quick_profile_measures_shallow_copies_and_reports_the_whole_model(tmp_path):
    from hybridflow.data import create_tiny_model_dir

    folder = create_tiny_model_dir(tmp_path / "three", seed=0, hidden=32, layers=3, heads=4, kv_heads=2)
    profile = profile_model(folder, threads=1, batch_sizes=(2, 4), repeats=1, depths=(1, 2))
    assert profile.measured_layers == (1, 2) and profile.model.layers == 3
    assert all(t > 0 for t in profile.forward_s + profile.train_s + profile.generate_s + profile.controller_s)
    assert calibrated_cluster(ClusterSpec.preset("cpu-local"), profile).mfu_train > 0
    whole = profile_model(folder, threads=1, batch_sizes=(2,), repeats=1, depths=(1, 3))  # not deeper: whole
    assert whole.measured_layers == ()
    with pytest.raises(ConfigError, match="depths"):
        profile_model(folder, threads=1, batch_sizes=(2,), repeats=1, depths=(2, 2))


# ------------------------------------------------------------------ the drift check
def _plan(predicted: float):
    plan = compile_for(ALGORITHMS["grpo"].build(), "qwen2.5-0.5b", batch=BatchShape(prompts=4, prompt_len=8, response_len=4))
    return plan.model_copy(update={"predicted_iteration_s": predicted})


def _spans(step_seconds):
    """One op span per iteration lasting the given seconds (iteration 0 first)."""
    return [Span("actor.generate", "actor.generate", "generate", "actor", "cpu", 100.0 * it, 100.0 * it + s, it)
            for it, s in enumerate(step_seconds)]


def test_the_drift_check_waits_for_its_steps_and_bounds_the_median_ratio():
    plan = _plan(2.0)
    assert drift_check(plan, _spans([9.0, 2.0, 2.2]), 0.5) is None  # iteration 3 not yet recorded
    assert CHECK_STEPS == 3
    # iteration 0 (9 s, the warm-up) is left out; the median of 2.0, 2.2, 5.0 is 2.2: 1.1x the prediction
    held = drift_check(plan, _spans([9.0, 2.0, 2.2, 5.0]), 0.5)
    assert held.ratio == pytest.approx(1.1) and not held.drifted
    slow = drift_check(plan, _spans([1.0, 3.2, 3.1, 3.3]), 0.5)  # 1.6x: beyond 1.5
    assert slow.ratio == pytest.approx(1.6) and slow.drifted
    fast = drift_check(plan, _spans([1.0, 1.2, 1.3, 1.2]), 0.5)  # 0.6x: below 1 / 1.5
    assert fast.drifted and not drift_check(plan, _spans([1.0, 1.4, 1.4, 1.4]), 0.5).drifted  # 0.7x: within


def _model_dir(tmp_path):
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({
        "model_type": "qwen2", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 2, "intermediate_size": 256, "vocab_size": 25}))
    return folder


def test_check_calibration_settles_the_runs_profiles(tmp_path, monkeypatch):
    import hybridflow.runtime.calibration as calibration

    measured = []
    monkeypatch.setenv("HYBRIDFLOW_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(calibration, "profile_model", lambda model, device="cpu", threads=None, **settings: (
        measured.append(model) or _rule_profile(_model(2)).model_copy(update={"threads": threads})))
    model = _model_dir(tmp_path)
    cached_profile(model, threads=1, busy=2.0)
    borrowed = cached_profile(model, threads=1, busy=0.0)
    assert borrowed[0].used_at_level == 0 and borrowed[0].cache_level == load_level(borrowed[0].busy_cores) == 2
    plan = _plan(2.0)
    assert check_calibration(plan, _spans([1.0, 2.0, 2.0]), [borrowed], 0.5) is None  # not yet
    assert check_calibration(plan, _spans([1.0, 2.0, 2.0, 2.0]), [borrowed], None) is None  # no check asked for
    verdict = check_calibration(plan, _spans([1.0, 2.0, 2.1, 2.0]), [borrowed], 0.5)
    assert not verdict.drifted
    own, cached = cached_profile(model, threads=1, busy=0.0)  # kept for level 0: read as its own now
    assert cached and own.used_at_level is None and len(measured) == 1
    assert check_calibration(plan, _spans([1.0, 9.0, 9.0, 9.0]), [(own, True)], 0.5).drifted
    _, cached = cached_profile(model, threads=1, busy=0.0)  # dropped: measured again
    assert not cached and len(measured) == 2
    assert settle_profile(own.model_copy(update={"cache_key": ""}), drifted=True) is None


def test_an_extrapolated_profile_that_drifts_at_home_has_the_next_start_measure_the_whole_model(tmp_path, monkeypatch):
    import hybridflow.runtime.calibration as calibration

    asked = []

    def fake(model, device="cpu", threads=None, depths=None, **settings):
        asked.append(depths)
        return _rule_profile(_model(8)).model_copy(update={"threads": threads, "measured_layers": tuple(depths or ())})

    monkeypatch.setenv("HYBRIDFLOW_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(calibration, "profile_model", fake)
    folder = tmp_path / "deep"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({
        "model_type": "qwen2", "hidden_size": 256, "num_hidden_layers": 8, "num_attention_heads": 8,
        "num_key_value_heads": 4, "intermediate_size": 1024, "vocab_size": 25}))
    quick, _ = cached_profile(folder, threads=1, busy=0.0)
    assert asked == [(1, 2)] and quick.measured_layers == (1, 2)
    assert "measures the whole model" in settle_profile(quick, drifted=True)
    whole, cached = cached_profile(folder, threads=1, busy=0.0)
    assert not cached and asked == [(1, 2), None] and whole.measured_layers == ()
    again, cached = cached_profile(folder, threads=1, busy=0.0)  # the whole model's profile is this level's now
    assert cached and again.measured_layers == () and len(asked) == 2
    assert "measures the whole model" in settle_profile(again, drifted=True)  # measured whole again, not extrapolated
    cached_profile(folder, threads=1, busy=0.0)
    assert asked == [(1, 2), None, None]
