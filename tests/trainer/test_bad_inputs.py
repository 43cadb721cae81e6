"""Bad inputs end in the project's named errors, never a raw traceback (issue 16, item 6).

Each case is one the issue found raising a bare exception: a device the machine lacks, a model
folder that is empty or whose config.json has a wrong-typed field, a dataset that is not UTF-8 or
has a non-text prompt, ``export --to`` an existing file, a hub name with the hub unreachable, a
reward server slower than its timeout, a YAML key given twice, and ``viz --iteration`` past the
trace's end. The hypothesis test feeds random override strings to the config loader.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hybridflow.cli import main
from hybridflow.errors import ConfigError, DataError, HybridflowError, ModelLoadError, RewardError, TraceError
from hybridflow.trainer.config import PPOConfig

REPO = Path(__file__).resolve().parents[2]


def test_a_device_the_machine_lacks_is_a_config_error(fast_config, capsys):
    from hybridflow.trainer import PPOTrainer

    with pytest.raises(ConfigError, match=r"device_map\.actor=cuda:99: this machine has (no CUDA device|\d+ CUDA)"):
        PPOTrainer(config=fast_config(device_map={"actor": "cuda:99"})).train()


def test_a_ray_address_nothing_answers_at_is_a_config_error_at_once(fast_config, tmp_path):
    # ray.init retries such an address for many minutes; nothing is sent beyond 127.0.0.1
    from hybridflow.runtime.ray.cluster import free_port
    from hybridflow.trainer import PPOTrainer

    assert "ray" not in sys.modules or not sys.modules["ray"].is_initialized()  # (the suite stops Ray before these)
    address = f"127.0.0.1:{free_port()}"  # free a moment ago: nothing listens there
    with pytest.raises(ConfigError, match=f"Ray cluster address '{address}': nothing answers there .*'ray start --head'"):
        PPOTrainer(config=fast_config(executor="ray", ray_address=address, output_dir=str(tmp_path / "run"))).train()


def test_training_a_graph_without_an_update_node_is_an_error(fast_config, monkeypatch):
    import dataclasses

    from hybridflow.errors import GraphValidationError
    from hybridflow.trainer import GRPOTrainer

    built = GRPOTrainer.build_graph

    def without_updates(self):
        graph = built(self)
        return dataclasses.replace(graph, nodes=tuple(n for n in graph.nodes if n.kind != "update"))

    monkeypatch.setattr(GRPOTrainer, "build_graph", without_updates)
    with pytest.raises(GraphValidationError, match="graph 'grpo' has no update node"):
        GRPOTrainer(config=fast_config()).train()


def test_a_config_json_with_a_wrong_typed_field_is_a_model_load_error(tiny_model_dir, tmp_path):
    from hybridflow.data import load_causal_lm

    folder = Path(shutil.copytree(tiny_model_dir, tmp_path / "model"))
    config = json.loads((folder / "config.json").read_text())
    config["hidden_size"] = "sixty-four"
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(ModelLoadError, match=r"config\.json is not a valid model config .*hidden_size"):
        load_causal_lm(folder)


def test_an_empty_model_folder_is_named_as_such(tmp_path):
    from hybridflow.data import load_causal_lm, load_tokenizer

    (tmp_path / "empty").mkdir()
    with pytest.raises(ModelLoadError, match="holds no tokenizer: no config.json or tokenizer files"):
        load_tokenizer(tmp_path / "empty")
    with pytest.raises(ModelLoadError, match="holds no model: no config.json"):
        load_causal_lm(tmp_path / "empty")


def test_a_dataset_that_is_not_utf8_names_the_line(tmp_path):
    from hybridflow.data import load_prompt_dataset

    path = tmp_path / "latin1.jsonl"
    row = {"prompt": "1+1=", "ground_truth": "2", "data_source": "arith"}
    path.write_bytes(json.dumps(row).encode() + b"\n" + json.dumps({**row, "prompt": "caf\u00e9"}).encode("latin-1")
                     .replace(b"\\u00e9", b"\xe9") + b"\n")
    with pytest.raises(DataError, match=r"latin1\.jsonl, line 2: not UTF-8 text \(byte 0xe9"):
        load_prompt_dataset(path)


def test_a_prompt_that_is_not_text_names_the_row(tmp_path):
    from hybridflow.data import load_prompt_dataset

    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps({"prompt": 5, "ground_truth": "5", "data_source": "arith"}) + "\n")
    with pytest.raises(DataError, match=r"row 0: column 'prompt' must be a string or a list of chat messages.*got int 5"):
        load_prompt_dataset(path)


def test_export_to_an_existing_file_is_a_named_error(tmp_path, capsys):
    (tmp_path / "model.bin").write_text("x")
    assert main(["export", str(tmp_path), "--to", str(tmp_path / "model.bin")]) == 1
    assert "hybridflow export: error: --to" in capsys.readouterr().err


def test_a_hub_name_with_the_hub_unreachable_fails_at_once(monkeypatch):
    from huggingface_hub import constants

    from hybridflow.data import load_tokenizer, pretrained

    for var in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(constants, "ENDPOINT", "http://127.0.0.1:9")  # nothing listens on the discard port
    monkeypatch.setattr(pretrained, "_HUB_REACHABLE", {})
    with pytest.raises(ModelLoadError, match=r"hub \(http://127\.0\.0\.1:9\) cannot be reached.*not in the local cache"):
        load_tokenizer("nobody/no-such-model-16")
    # one probe decided it (remembered for the process), so transformers' minute of retries never started
    assert pretrained._HUB_REACHABLE == {"127.0.0.1:9": False}


def test_a_reward_server_slower_than_the_timeout_says_so():
    from hybridflow.utils import RemoteRewardModel

    class Slow(BaseHTTPRequestHandler):
        def do_POST(self):
            time.sleep(0.6)
            self.send_response(200)
            self.end_headers()

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Slow)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        model = RemoteRewardModel(f"http://127.0.0.1:{server.server_port}/score", timeout=0.2, max_retries=0)
        with pytest.raises(RewardError, match=r"timed out after 0\.2 s .* raise timeout="):
            model.score_texts(["1+1="], ["2"])
    finally:
        server.shutdown()
        server.server_close()


def test_a_yaml_key_given_twice_is_an_error_from_the_command_line(tmp_path):
    run_file = tmp_path / "run.yaml"
    run_file.write_text("max_steps: 3\nactor_lr: 1.0e-3\nmax_steps: 5\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p))
    done = subprocess.run([sys.executable, "-m", "hybridflow.cli", "run", str(run_file)], capture_output=True, text=True,
                          env=env, timeout=600)
    assert done.returncode == 1
    assert "line 3, column 1: key 'max_steps' is given twice (first at line 1); keep one" in done.stderr
    assert "Traceback" not in done.stderr


def test_viz_iteration_past_the_trace_is_an_error(tmp_path, capsys):
    events = [{"ph": "X", "name": "actor.generate", "ts": 10.0 * i, "dur": 5.0, "tid": 1,
               "args": {"iteration": i, "kind": "generate", "role": "actor"}} for i in range(5)]
    trace = tmp_path / "trace.json"
    trace.write_text(json.dumps({"traceEvents": events}))
    assert main(["viz", str(trace), "--iteration", "99", "-o", str(tmp_path / "out")]) == 1
    assert "--iteration 99: the trace holds iterations 0..4" in capsys.readouterr().err
    from hybridflow.viz.gantt import trace_rows

    with pytest.raises(TraceError):
        trace_rows({"traceEvents": events}, 7)
    assert trace_rows({"traceEvents": events}, 4)[1] == 4


_FIELDS = [*PPOConfig.model_fields, "algorithm", "device_map.actor", "actor_lr_schedule.name", "nope", ""]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.one_of(st.text(max_size=40),
                 st.tuples(st.sampled_from(_FIELDS), st.text(max_size=30)).map(lambda kv: f"{kv[0]}={kv[1]}"),
                 st.tuples(st.sampled_from(_FIELDS), st.sampled_from(["1", "-1", "0.5", "[1, 2]", "{a: 1}", "null",
                                                                      "true", "'x'", "{a: 1, a: 2}", "!!binary AA==",
                                                                      "1e999", "cuda:3", "[", "&a [*a]"]))
                 .map(lambda kv: f"{kv[0]}={kv[1]}")))
def test_random_override_strings_only_ever_raise_project_errors(item):
    from hybridflow.trainer.config_files import load_run_config

    try:
        load_run_config(None, [item])
    except HybridflowError:
        pass
