"""RemoteRewardModel against a real HTTP server on 127.0.0.1 (http.server in a thread)."""
from __future__ import annotations

import json
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import torch

from hybridflow.errors import RewardError
from hybridflow.batch import Batch
from hybridflow.utils import RemoteRewardModel


def _length_score(prompt: str, response: str) -> float:
    """The server's reward: a number both sides can compute (response length minus a tenth of the prompt's)."""
    return len(response) - 0.1 * len(prompt)


class Handler(BaseHTTPRequestHandler):
    """Answers by path: /score (generic), /v1/rank (vLLM/Cohere results), /tei/rerank (TEI list), /nan, /html,
    /short (a score missing), /flaky (503 twice, then /score), /forbidden (403)."""

    requests: list = []
    flaky_left = 0

    def log_message(self, *args):
        pass

    def _reply(self, code: int, body: str, kind: str = "application/json"):
        self.send_response(code)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body.encode())))
        self.end_headers()
        self.wfile.write(body.encode())

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        Handler.requests.append((self.path, body))
        path = self.path
        if path == "/flaky":
            if Handler.flaky_left > 0:
                Handler.flaky_left -= 1
                return self._reply(503, "busy")
            path = "/score"
        if path in ("/score", "/short", "/nan"):
            scores = [_length_score(q, r) for q, r in zip(body["query"], body["responses"])]
            if path == "/short":
                scores = scores[:-1]
            if path == "/nan":
                scores[0] = float("nan")
            return self._reply(200, json.dumps({"scores": scores}))
        if path == "/v1/rank":  # results out of order, with indices, as rerank servers sort by score
            results = [{"index": i, "relevance_score": _length_score(body["query"], d)} for i, d in enumerate(body["documents"])]
            return self._reply(200, json.dumps({"id": "x", "results": results[::-1]}))
        if path == "/tei/rerank":
            return self._reply(200, json.dumps([{"index": i, "score": _length_score(body["query"], t)}
                                                for i, t in enumerate(body["texts"])]))
        if path == "/html":
            return self._reply(200, "<html>oops</html>", "text/html")
        return self._reply(403, "no key")


@pytest.fixture(scope="module")
def server():
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


PROMPTS = ["2+3=", "2+3=", "10+11=", "7+1="]
RESPONSES = ["5", "66", "21", ""]
EXPECTED = [_length_score(p, r) for p, r in zip(PROMPTS, RESPONSES)]  # [0.6, 1.6, 1.4, -0.4]


def _batch() -> Batch:
    return Batch({"response_ids": torch.zeros(4, 2, dtype=torch.long)}, {"prompt": PROMPTS, "responses": RESPONSES})


def test_generic_scores_format_in_batches(server):
    Handler.requests.clear()
    rm = RemoteRewardModel(api_url=f"{server}/score", model_name="rm-test", batch_size=3)
    out = rm.score(_batch())
    assert out.scores.dtype == torch.float32
    assert out.scores.tolist() == pytest.approx(EXPECTED)
    assert [len(body["responses"]) for _, body in Handler.requests] == [3, 1]
    assert Handler.requests[0][1] == {"model": "rm-test", "query": PROMPTS[:3], "responses": RESPONSES[:3]}


def test_seed_article_rank_url_uses_the_rerank_format(server):
    Handler.requests.clear()
    rm = RemoteRewardModel(api_url=f"{server}/v1/rank", model_name="rm-bloomz")
    assert rm.api_format == "rerank"
    assert rm.score_texts(PROMPTS, RESPONSES) == pytest.approx(EXPECTED)
    queries = [body["query"] for _, body in Handler.requests]
    assert queries == ["2+3=", "10+11=", "7+1="]  # one request per distinct prompt
    assert Handler.requests[0][1]["documents"] == ["5", "66"]


def test_tei_rerank_list_reply(server):
    rm = RemoteRewardModel(api_url=f"{server}/tei/rerank")
    assert rm.score_texts(PROMPTS, RESPONSES) == pytest.approx(EXPECTED)


def test_chat_prompts_are_sent_as_their_text(server):
    Handler.requests.clear()
    rm = RemoteRewardModel(api_url=f"{server}/score")
    rm.score_texts([[{"role": "user", "content": "2+3="}]], ["5"])
    assert Handler.requests[0][1]["query"] == ["2+3="]


def test_retries_with_backoff_then_succeeds(server):
    Handler.flaky_left = 2
    rm = RemoteRewardModel(api_url=f"{server}/flaky", max_retries=2, backoff=0.01)
    assert rm.score_texts(PROMPTS, RESPONSES) == pytest.approx(EXPECTED)
    Handler.flaky_left = 5
    with pytest.raises(RewardError, match=r"flaky unreachable after 2 attempts \(last error: HTTP 503"):
        RemoteRewardModel(api_url=f"{server}/flaky", max_retries=1, backoff=0.01).score_texts(PROMPTS, RESPONSES)


@pytest.mark.parametrize("path, message", [
    ("/nan", "malformed reply \\(score 0 is nan, not a finite number\\)"),
    ("/short", "malformed reply \\(the reply has 3 scores for 4 responses\\)"),
    ("/html", "malformed reply \\(not JSON\\): '<html>oops</html>'"),
    ("/forbidden", "answered HTTP 403"),
])
def test_bad_replies_name_the_url_and_the_problem(server, path, message):
    rm = RemoteRewardModel(api_url=f"{server}{path}", api_format="scores", max_retries=0)
    with pytest.raises(RewardError, match=f"reward server {server}{path}.*{message}"):
        rm.score_texts(PROMPTS, RESPONSES)


def test_unreachable_server_is_an_error_never_a_zero():
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    rm = RemoteRewardModel(api_url=f"http://127.0.0.1:{port}/v1/rank", max_retries=1, backoff=0.0, timeout=2)
    with pytest.raises(RewardError, match=f"127.0.0.1:{port}/v1/rank unreachable after 2 attempts.*Connection"):
        rm.score_texts(["1+1="], ["2"])


def test_bad_arguments():
    with pytest.raises(RewardError, match="not an http"):
        RemoteRewardModel(api_url="localhost:8000/v1/rank")
    with pytest.raises(RewardError, match="api_format 'grpc' is unknown"):
        RemoteRewardModel(api_url="http://h/x", api_format="grpc")


def test_trainer_trains_with_a_remote_reward(server, tmp_path):
    """A GRPO step whose scores come over HTTP (scores: response length), through set_reward_model."""
    from hybridflow import PPOConfig
    from hybridflow.algorithms import GRPOTrainer

    config = PPOConfig(output_dir=str(tmp_path / "run"), max_steps=1, rollout_batch_size=4, n_samples=2,
                       trackers=("jsonl",), progress_bar=False, val_samples=1, unfinished_score=None)
    trainer = GRPOTrainer(config=config)
    trainer.set_reward_model(RemoteRewardModel(api_url=f"{server}/v1/rank", model_name="rm-test"))
    history = trainer.train()
    assert history[0]["reward/score/mean"] != 0.0 and "critic/score/mean" not in history[0] and "actor/pg_loss" in history[0]


def test_a_run_file_names_the_reward_server(server, tmp_path):
    """The config route: ``reward_server.url=...`` on the command line (as in a YAML run file) scores over HTTP; the
    server saw every training response of the step, in the rerank format of its /v1/rank URL."""
    from hybridflow.cli import main

    Handler.requests.clear()
    out = tmp_path / "run"
    code = main(["run", f"output_dir={out}", "max_steps=1", "rollout_batch_size=4", "n_samples=2", "algorithm=grpo",
                 "trackers=[jsonl]", "val_samples=1", "eval_freq=0", "unfinished_score=null",
                 f"reward_server.url={server}/v1/rank", "reward_server.model_name=rm-cli"])
    assert code == 0
    (record,) = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if '"step": 1' in line]
    assert record["reward/score/mean"] != 0.0
    ranked = [body for path, body in Handler.requests if path == "/v1/rank"]
    assert ranked and all(body["model"] == "rm-cli" for body in ranked)
    assert sum(len(body["documents"]) for body in ranked) >= 8  # 4 prompts x 2 samples (plus validation's)


def test_a_reward_server_and_a_reward_model_together_are_refused():
    from hybridflow import PPOConfig
    from hybridflow.errors import ConfigError

    with pytest.raises((ConfigError, ValueError), match="reward_server .* and reward_model_name .* both name the reward"):
        PPOConfig(reward_server={"url": "http://127.0.0.1:9/v1/rank"}, reward_model_name="some/rm")
