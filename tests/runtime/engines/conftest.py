"""Fixtures of the engine tests: the tiny tokenizer, a tiny model, a prompt batch."""
from __future__ import annotations

import pytest
import torch
from engine_testkit import prompt_batch, tiny_model

from hybridflow.data.tiny import make_tiny_tokenizer
from hybridflow.batch import Batch

torch.set_num_threads(1)


@pytest.fixture(scope="session")
def tokenizer():
    return make_tiny_tokenizer("arithmetic")


@pytest.fixture
def model(tokenizer):
    return tiny_model(tokenizer)


@pytest.fixture
def prompts(tokenizer) -> Batch:
    return prompt_batch(tokenizer)
