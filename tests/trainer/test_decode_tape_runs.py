"""A GRPO run whose updates take the decode's products (decode_tape) against one that computes them."""
from __future__ import annotations

import math

import pytest

from hybridflow.runtime.engines import decode_tape


def test_a_run_takes_the_decodes_products_and_logs_what_a_computing_run_logs(fast_config, tmp_path, monkeypatch):
    from hybridflow.trainer import Trainer

    monkeypatch.setattr(decode_tape, "MIN_HIDDEN", 0)  # the tiny test model is narrower than the default

    runs, replayed = {}, {}
    for keep in (True, False):
        before = dict(decode_tape.COUNTS)
        config = fast_config(output_dir=str(tmp_path / f"keep{keep}"), max_response_length=12, n_samples=4,
                             rollout_batch_size=4, max_steps=1, calibrate=False,
                             rollout_engine_options={"keep_products": keep})
        runs[keep] = Trainer(config, algorithm="grpo").train()
        replayed[keep] = {k: decode_tape.COUNTS[k] - before.get(k, 0) for k in ("recorded", "replayed")}
    # the train engine shares the rollout's model: its update's forward took the tape, once a micro-batch
    assert replayed[True]["recorded"] >= 1 and replayed[True]["replayed"] >= 1
    assert replayed[False] == {"recorded": 0, "replayed": 0}
    (kept,), (computed,) = runs[True], runs[False]
    compared = 0
    for key, value in computed.items():
        if key.startswith(("timing_s/", "perf/")) or not isinstance(value, (int, float)) or not math.isfinite(value):
            continue
        assert kept[key] == pytest.approx(value, abs=1e-5, rel=1e-5), key
        compared += 1
    assert compared > 20


def test_only_generations_an_update_trains_on_may_keep_their_products():
    from hybridflow.algorithms import get_algorithm
    from hybridflow.compiler.validation import validation_graph
    from hybridflow.runtime.node_calls import read_by_update

    def kept(graph):
        return {n.name: read_by_update(graph, n) for n in graph.nodes if n.kind == "generate"}

    assert kept(get_algorithm("grpo").build()) == {"actor.generate": True}
    assert kept(get_algorithm("ppo").build()) == {"actor.generate": True}
    # ReMax's greedy baseline is scored, not trained on; validation trains on nothing
    assert kept(get_algorithm("remax").build()) == {"actor.generate": True, "actor.generate_greedy": False}
    assert kept(validation_graph()) == {"actor.generate_greedy": False, "actor.generate": False}
