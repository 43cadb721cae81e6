"""docs/operators.md is generated from the op registry (tools/gen_operator_docs.py) and must match it."""
import importlib.util
from pathlib import Path

import pytest

from hybridflow_ops import list_ops

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def gen():
    spec = importlib.util.spec_from_file_location("gen_operator_docs", ROOT / "tools" / "gen_operator_docs.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_committed_operator_docs_equal_the_generated_page(gen):
    assert gen.DOC_PATH == ROOT / "docs" / "operators.md"
    assert gen.DOC_PATH.read_text() == gen.render(), "docs/operators.md is stale: run tools/gen_operator_docs.py"
    assert gen.main(["--check"]) == 0


def test_every_hybridflow_ops_op_has_a_section_and_a_paper(gen):
    page = gen.render()
    for spec in list_ops():
        if not spec.fn.__module__.startswith("hybridflow_ops."):
            continue  # ops registered by tests or by users are not documented here
        assert f"### `{spec.name}`" in page
        if spec.name != "nll":  # supervised NLL: no paper to cite
            assert gen.references(spec.doc) != "—", f"{spec.name}'s docstring cites no paper"


def test_references_prefers_arxiv_ids_then_the_reference_sentence(gen):
    assert gen.references("x\nReference: Foo 2020, arXiv 2501.00001 and arXiv 2501.00001.") == \
        "[arXiv 2501.00001](https://arxiv.org/abs/2501.00001)"
    assert gen.references("Reference: Foo et al. 2020, \"A paper\". Metrics: none.") == 'Foo et al. 2020, "A paper".'
    assert gen.references("as in Foo et al.\n2021 and Bar 2019") == "Foo et al. 2021; Bar 2019"
    assert gen.references("no citation") == "—"


def test_check_mode_reports_a_stale_page(gen, tmp_path):
    stale = tmp_path / "operators.md"
    stale.write_text("old\n")
    assert gen.main(["--check", "--output", str(stale)]) == 1
    assert gen.main(["--output", str(stale)]) == 0 and gen.main(["--check", "--output", str(stale)]) == 0
