"""Fixtures of the engine tests: the tiny tokenizer, a tiny model, a prompt batch."""
from __future__ import annotations

import pytest
import torch
from engine_testkit import prompt_batch, tiny_model

from hybridflow.data.tiny import make_tiny_tokenizer
from hybridflow.batch import Batch


@pytest.fixture(autouse=True)
def one_thread():
    """Each engine test at one torch thread, whatever a test before it in this worker set (a trainer run sizes its
    threads): the decode's to-the-bit checks hold at one thread; on an AVX2 CPU (AMD EPYC, Zen 2) at two threads a
    compacted decode's log-probs differed from the uncompacted ones in the last bits (lean_decode.ROW_BLOCK)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def tokenizer():
    return make_tiny_tokenizer("arithmetic")


@pytest.fixture
def model(tokenizer):
    return tiny_model(tokenizer)


@pytest.fixture
def prompts(tokenizer) -> Batch:
    return prompt_batch(tokenizer)
