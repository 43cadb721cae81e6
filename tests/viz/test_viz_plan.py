"""Drawings of compiled plans: placement (DOT/SVG), Gantt chart (SVG), Chrome trace; `hybridflow viz plan.json`."""
from __future__ import annotations

import json
import re
import shutil
import warnings
import xml.etree.ElementTree as ET

import pytest

from hybridflow.algorithms import ALGORITHMS
from hybridflow.cli import main
from hybridflow.compiler.compile import compile
from hybridflow.runtime.spans import Span, chrome_trace
from hybridflow.viz.gantt import gantt_svg, plan_rows, trace_rows
from hybridflow.viz.plan import plan_to_dot
from hybridflow.viz.trace import plan_trace

SVG = "{http://www.w3.org/2000/svg}"


@pytest.fixture(scope="module")
def plans():
    graph = ALGORITHMS["ppo"].build()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        return {
            "colocate": compile(graph, "a100-80g:2", {"actor": "llama2-7b"}, placement="colocate"),
            "split": compile(graph, "a100-80g:2", {"actor": "llama2-7b"}, placement="split"),
            "rollout": compile(graph, "a100-80g:2", {"actor": "llama2-7b"}, staleness=1, allow_uncorrected_staleness=True,
                               placement="actor+ref@8;critic+reward@4;actor.generate@4"),
            "offload": compile(graph, "a100-80g:2", {"actor": "llama2-34b"}, placement="colocate"),
        }


@pytest.mark.parametrize("case", ["colocate", "split", "rollout", "offload"])
def test_placement_drawing_shows_every_role_pool_layout_and_the_weight_sync(plans, case):
    plan = plans[case]
    source = plan_to_dot(plan).source
    for pool in plan.pools:
        assert f"cluster_{pool.name}" in source and f"<b>{pool.name}</b>" in source
    for p in plan.placements:
        assert f"<b>{p.role}</b>" in source and str(p.layout) in source
        if p.generation_layout:
            assert f"generate {p.generation_layout}" in source
    sync = next(op for op in plan.ops if op.kind == "weight_sync")
    assert f"<b>{sync.name}</b>" in source
    assert ("broadcast to " + sync.target_pool if sync.target_pool else f"{len(sync.rank_groups)} micro-DP groups") in source
    assert ("offload: each role" in source) == any(p.offload for p in plan.pools)


def test_gantt_has_one_bar_per_op_and_pool_on_one_time_axis(plans):
    plan = plans["rollout"]
    rows = plan_rows(plan)
    assert [r.label for r in rows] == ["pool0 (8 dev.)", "pool1 (4 dev.)", "pool2 (4 dev.)", "controller"]
    expected = sum(1 + (op.target_pool is not None) for op in plan.ops)  # a cross-pool sync is drawn on both pools
    assert sum(len(r.bars) for r in rows) == expected
    root = ET.fromstring(gantt_svg(plan))
    titles = [t.text for t in root.iter(f"{SVG}title")]
    assert len(titles) == expected and any("works for iteration i+1" in t for t in titles)
    generate = next(b for r in rows for b in r.bars if b.label == "actor.generate")
    op = next(o for o in plan.ops if o.name == "actor.generate")
    assert generate.later_iteration == 1 and (generate.start, generate.end) == (op.predicted_start_s, op.predicted_end_s)


def test_gantt_draws_a_real_trace_beside_the_plan_on_the_same_axis(plans):
    plan = plans["split"]
    spans = [Span(op=f"op{k}", node=f"node{k}", kind="infer", role="actor", device="cpu", start=100 + 10 * i + k,
                  end=100 + 10 * i + k + 0.5, iteration=i) for i in range(3) for k in range(2)]
    trace = chrome_trace(spans)
    rows, chosen = trace_rows(trace)
    assert chosen == 2 and [(b.start, b.end) for b in rows[0].bars] == [(0.0, 0.5), (1.0, 1.5)]  # last iteration, shifted to 0
    rows, chosen = trace_rows(trace, iteration=0)
    assert chosen == 0 and rows[0].label == "cpu"
    svg = gantt_svg(plan, trace, iteration=1)
    assert "measured: run trace, iteration 1" in svg and "predicted: ppo" in svg
    root = ET.fromstring(svg)
    assert len([t for t in root.iter(f"{SVG}title")]) == len(plan.ops) + 2


def test_chrome_trace_of_a_plan_has_a_track_per_pool_and_microsecond_events(plans):
    plan = plans["offload"]
    trace = plan_trace(plan)
    names = [e["args"]["name"] for e in trace["traceEvents"] if e.get("name") == "thread_name"]
    assert names == ["pool0 (16 devices)", "controller"]
    events = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    assert len(events) == len(plan.ops)
    update = next(e for e in events if e["name"] == "actor.update")
    op = next(o for o in plan.ops if o.name == "actor.update")
    assert update["ts"] == pytest.approx(op.predicted_start_s * 1e6, abs=1e-3)
    assert update["dur"] == pytest.approx((op.predicted_end_s - op.predicted_start_s) * 1e6, abs=1e-3)
    assert {e["args"]["kind"] for e in events} == {"node", "weight_sync", "offload", "onload"}
    json.dumps(trace)  # plain JSON


def test_viz_command_draws_plans_and_traces(plans, tmp_path, capsys):
    path = tmp_path / "ppo.plan.json"
    path.write_text(plans["rollout"].to_json())
    run = tmp_path / "run.json"
    run.write_text(json.dumps(chrome_trace([Span("a", "actor.generate", "generate", "actor", "cpu", 0.0, 1.0)])))
    assert main(["viz", str(path), "-o", str(tmp_path / "out" / "ppo"), "--trace", str(run)]) == 0
    assert "ui.perfetto.dev" in capsys.readouterr().out
    out = tmp_path / "out"
    assert (out / "ppo.dot").exists() and (out / "ppo.gantt.svg").exists()
    assert json.loads((out / "ppo.trace.json").read_text())["traceEvents"]
    assert "measured: run trace" in (out / "ppo.gantt.svg").read_text()
    # the plan has staleness 1: its graph is drawn beside it, the rollout's edges dashed with their lag
    drawn = (out / "ppo.graph.dot").read_text()
    assert re.search(r'whiten -> "actor.update" \[label="advantages\nlag=1" ', drawn)
    assert re.search(r'"actor.logprob" -> "actor.update" \[label=old_log_probs\]', drawn)
    if shutil.which("dot"):
        assert "actor.weight_sync" in (out / "ppo.svg").read_text()
    assert main(["viz", str(run), "-o", str(tmp_path / "replay")]) == 0
    assert (tmp_path / "replay.gantt.svg").exists()
    assert main(["viz", str(path), "--trace", str(path)]) == 1
    assert "not a Chrome trace" in capsys.readouterr().err
    broken = tmp_path / "broken.json"
    broken.write_text(json.dumps({**json.loads(path.read_text()), "pools": "nope"}))
    assert main(["viz", str(broken)]) == 1
    assert "not a valid plan" in capsys.readouterr().err
