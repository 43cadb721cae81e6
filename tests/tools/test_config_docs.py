"""docs/configuration.md is generated from PPOConfig (tools/gen_config_docs.py) and must match it."""
import importlib.util
from pathlib import Path

import pytest

from hybridflow.trainer.config import GRAPH_ATTRS, PPOConfig

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def gen():
    spec = importlib.util.spec_from_file_location("gen_config_docs", ROOT / "tools" / "gen_config_docs.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_committed_config_docs_equal_the_generated_page(gen):
    assert gen.DOC_PATH.read_text() == gen.render(), "docs/configuration.md is stale: run tools/gen_config_docs.py"
    assert gen.main(["--check"]) == 0


def test_every_field_has_a_row_and_every_mapping_is_listed(gen):
    page = gen.render()
    for name in PPOConfig.model_fields:
        assert f"| `{name}` |" in page, name
    for field, attr in GRAPH_ATTRS.items():
        assert f"| `{field}` | `{attr}`" in page or f"| `{field}` | `{attr}`, and" in page, field
    assert "| `clip_ratio_high` | `clip_high` |" in page and "`kl_as_loss` = not kl_in_reward" in page
    # every field sits under one section, in the order of the class body
    listed = [n for _, names in gen._sections() for n in names]
    assert listed == list(PPOConfig.model_fields)


def test_check_mode_reports_a_stale_page(gen, tmp_path):
    stale = tmp_path / "configuration.md"
    stale.write_text("old\n")
    assert gen.main(["--check", "--output", str(stale)]) == 1
    assert gen.main(["--output", str(stale)]) == 0 and gen.main(["--check", "--output", str(stale)]) == 0
