"""Predicted asynchronous step time (hybridflow.compiler.async_cost): hand-worked cases, the M/M/1/N closed
form, and monotonicity in the staleness k."""
import math

import pytest
from hypothesis import given, settings, strategies as st

from hybridflow.compiler.async_cost import (_gamma_samples, constant_step_s, exponential_step_s, predict_async,
                                            samples_per_s, simulate_async)
from hybridflow.errors import ConfigError


@pytest.mark.parametrize("sync", ["collective", "staged"])
def test_constant_times_k0_is_serial(sync):
    # g=2, t=1, s=0.5: generation j waits for update j-1 and its sync; 2 + 0.5 + 1 per step
    assert predict_async(2.0, 1.0, 0, sync_s=0.5, sync=sync) == 3.5
    assert simulate_async([2.0], [1.0], 0, sync_s=0.5, sync=sync, steps=30).step_s() == pytest.approx(3.5, rel=1e-12)


@pytest.mark.parametrize("k", [1, 2, 4])
def test_constant_times_pipelined(k):
    # collective: lock step, s + max(g, t) = 0.5 + 2; staged: R cycles g + s = 2.5, P t = 1 -> 2.5 too
    assert predict_async(2.0, 1.0, k, sync_s=0.5) == 2.5
    # training slower than generation: collective 0.5 + 3 = 3.5; staged max(2 + 0.5, 3) = 3
    assert predict_async(2.0, 3.0, k, sync_s=0.5) == 3.5
    assert predict_async(2.0, 3.0, k, sync_s=0.5, sync="staged") == 3.0
    for sync in ("collective", "staged"):
        for g, t in ((2.0, 1.0), (2.0, 3.0)):
            run = simulate_async([g], [t], k, sync_s=0.5, sync=sync, steps=10 * (k + 3))
            assert run.step_s() == pytest.approx(constant_step_s(g, t, k, sync_s=0.5, sync=sync), rel=1e-12)


def test_hand_worked_varying_generation():
    # generations alternate 1 s and 3 s (mean 2), training 2 s, no sync cost.
    # k=1 staged: gen0 [0,1] gen1 [1,4] train0 [1,3]; gen2 waits for train0 and gen1: [4,5], train1 [4,6];
    # gen3 [6,9] train2 [6,8]; gen4 [9,10] train3 [9,11]: 5 s per two steps, 2.5 per step.
    # k=2 staged: gen3 may start when train0 ends, so the slow generations hide behind training: 2 s per step.
    # collective, any k >= 1: training v and generation v+k start together, max(2, 1) and max(2, 3) alternate: 2.5.
    run = simulate_async([1.0, 3.0], [2.0], 1, sync="staged", steps=8)
    assert run.gen_start[:5] == (0.0, 1.0, 4.0, 6.0, 9.0)
    assert run.train_end[:4] == (3.0, 6.0, 8.0, 11.0)
    assert simulate_async([1.0, 3.0], [2.0], 1, sync="staged", steps=40).step_s() == 2.5
    assert simulate_async([1.0, 3.0], [2.0], 2, sync="staged", steps=40).step_s() == 2.0
    for k in (1, 2, 4):
        assert simulate_async([1.0, 3.0], [2.0], k, steps=40).step_s() == 2.5
    assert predict_async(None, 2.0, 4, gen_samples=[1.0, 3.0], sync="staged", steps=40) == 2.0


def test_variance_makes_k1_slower_than_k4():
    # generation 1 s on average with CV 1, training 1 s: a deeper buffer hides the long generations (staged sync);
    # with constant times both would take 1 s
    k1 = predict_async(1.0, 1.0, 1, gen_cv=1.0, sync="staged")
    k4 = predict_async(1.0, 1.0, 4, gen_cv=1.0, sync="staged")
    assert k4 < k1
    assert k4 < 0.9 * k1
    # the collective sync holds the pools in lock step: k=4 gains nothing over k=1 (statistically equal)
    c1 = predict_async(1.0, 1.0, 1, gen_cv=1.0)
    c4 = predict_async(1.0, 1.0, 4, gen_cv=1.0)
    assert c4 == pytest.approx(c1, rel=0.03)
    assert c4 > k4


@pytest.mark.parametrize("g,t", [(1.0, 1.0), (1.0, 0.5), (0.7, 1.0)])
@pytest.mark.parametrize("k", [0, 1, 2, 4])
def test_matches_mm1n_closed_form(g, t, k):
    # exponential generation and training, staged, no sync: the M/M/1/(k+1) chain (module docstring)
    n = 20000  # the estimate's error is about 1 % at this length (seeded: the same numbers every run)
    run = simulate_async(_gamma_samples(g, 1.0, n + k, 1), _gamma_samples(t, 1.0, n, 2), k, sync="staged", steps=n)
    assert run.step_s() == pytest.approx(exponential_step_s(g, t, k), rel=0.02)


def test_closed_form_by_hand():
    # rho = 1: step = g (k+2)/(k+1)
    assert exponential_step_s(1.0, 1.0, 1) == pytest.approx(1.5)
    assert exponential_step_s(1.0, 1.0, 4) == pytest.approx(1.2)
    # k = 0: N = 1, throughput = lam (1 - rho)/(1 - rho^2) = lam / (1 + rho) -> step g + t
    assert exponential_step_s(1.0, 0.5, 0) == pytest.approx(1.5)


times = st.lists(st.floats(0.0, 10.0, allow_nan=False), min_size=1, max_size=8)


@settings(max_examples=60, deadline=None)
@given(gen=times, train=times, sync_s=st.floats(0.0, 2.0), k=st.integers(0, 5), sync=st.sampled_from(["collective", "staged"]))
def test_makespan_non_increasing_in_k_staged_and_bounded(gen, train, sync_s, k, sync):
    steps = 12
    run = simulate_async(gen, train, k, sync_s=sync_s, sync=sync, steps=steps)
    # order and resources: each step trains after its rollout; each pool runs one thing at a time
    for v in range(steps):
        assert run.train_start[v] >= run.gen_end[v] - 1e-9
        if v:
            assert run.train_start[v] >= run.train_end[v - 1] - 1e-9
            assert run.gen_start[v] >= run.gen_end[v - 1] - 1e-9
        # staleness: generation v used the weights of update v-k-1 at the latest
        if v - k - 1 >= 0:
            assert run.gen_start[v] >= run.train_end[v - k - 1] - 1e-9
    if sync == "staged":  # a deeper buffer only relaxes constraints (max-plus monotone): never later
        deeper = simulate_async(gen, train, k + 1, sync_s=sync_s, sync=sync, steps=steps)
        assert deeper.makespan_s <= run.makespan_s + 1e-9


@settings(max_examples=60, deadline=None)
@given(g=st.floats(0.0, 10.0), t=st.floats(0.0, 10.0), s=st.floats(0.0, 2.0), k=st.integers(0, 6),
       sync=st.sampled_from(["collective", "staged"]))
def test_constant_step_non_increasing_in_k(g, t, s, k, sync):
    assert predict_async(g, t, k + 1, sync_s=s, sync=sync) <= predict_async(g, t, k, sync_s=s, sync=sync)
    assert predict_async(g, t, k, sync_s=s, sync=sync) >= max(g, t)


def test_throughput():
    assert samples_per_s(64, 2.0) == 32.0
    assert math.isinf(samples_per_s(64, 0.0))


def test_bad_input_is_named():
    with pytest.raises(ConfigError, match="staleness"):
        predict_async(1.0, 1.0, -1)
    with pytest.raises(ConfigError, match="sync="):
        predict_async(1.0, 1.0, 1, sync="nccl")
    with pytest.raises(ConfigError, match="not both"):
        predict_async(1.0, 1.0, 1, gen_samples=[1.0])
    with pytest.raises(ConfigError, match="gen_s"):
        simulate_async([], [1.0], 1)
