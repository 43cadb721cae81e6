"""The documentation site: it builds with ``mkdocs build --strict``, its tutorial pages' code blocks run
and print what the text quotes (tests/docs/doc_blocks.py), and the pages generated from the code or
listing the code's names (configuration, operators, troubleshooting) cannot drift from it."""
from __future__ import annotations

import inspect
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

import hybridflow.errors
from doc_blocks import DOCS, ROOT, RUNNABLE_PAGES, blocks, run_page


def _nav_pages(nav) -> list[str]:
    pages = []
    for entry in nav:
        for value in entry.values():
            pages += _nav_pages(value) if isinstance(value, list) else [value]
    return pages


def test_every_page_is_in_the_nav_and_every_nav_entry_exists():
    nav = _nav_pages(yaml.safe_load((ROOT / "mkdocs.yml").read_text())["nav"])
    assert sorted(nav) == sorted(p.name for p in DOCS.glob("*.md"))


@pytest.mark.parametrize("page", RUNNABLE_PAGES)
def test_every_block_of_a_runnable_page_is_marked(page):
    found = blocks((DOCS / page).read_text())
    unmarked = [b.line for b in found if b.mark is None]
    assert not unmarked, f"{page}: blocks at lines {unmarked} carry no run/file/output/norun mark"
    assert sum(b.mark == "run" for b in found) >= 2


def test_the_tutorial_file_is_the_example():
    (algorithm,) = [b for b in blocks((DOCS / "tutorial.md").read_text()) if b.arg == "rloo_lenpen.py"]
    assert algorithm.code == (ROOT / "examples" / "custom_algorithm" / "rloo_lenpen.py").read_text()


def test_output_checks_can_fail(tmp_path):
    page = tmp_path / "probe.md"
    page.write_text("<!-- run -->\n```bash\necho hello world\n```\n\n<!-- output -->\n```text\nhello\nworld\n```\n")
    assert run_page(page, tmp_path) == 1  # two quoted parts of one printed line
    page.write_text(page.read_text().replace("hello\nworld\n", "hello\nworld\nbye\n"))
    with pytest.raises(AssertionError, match="probe.md:7: the quoted output line 'bye' was not printed"):
        run_page(page, tmp_path)
    page.write_text("<!-- run -->\n```bash\nexit 3\n```\n")
    with pytest.raises(AssertionError, match="probe.md:2: the block exited with 3"):
        run_page(page, tmp_path)


@pytest.mark.e2e
def test_the_tutorial_runs_as_written(tmp_path):
    start = time.perf_counter()
    ran = run_page("tutorial.md", tmp_path)
    print(f"tutorial.md: {ran} blocks ran in {time.perf_counter() - start:.0f} s")
    assert ran == sum(b.mark == "run" for b in blocks((DOCS / "tutorial.md").read_text()))


def test_the_checkpoint_page_lists_the_fields_a_resume_may_change():
    from hybridflow.trainer.config import RUN_CONTROL_FIELDS

    text = (DOCS / "checkpoints.md").read_text()
    start = text.index("The hash\ncovers every field but")
    listed = set(re.findall(r"`(\w+)`", text[start:text.index("is an error.", start)]))
    assert RUN_CONTROL_FIELDS <= listed, sorted(RUN_CONTROL_FIELDS - listed)
    assert not (listed - RUN_CONTROL_FIELDS) - {"seed"}, sorted(listed - RUN_CONTROL_FIELDS)


def test_the_custom_loss_of_the_custom_algorithm_page_trains_as_written(tmp_path):
    """The loss-op contract's example (a file block, then the command that trains with it)."""
    assert run_page("custom_algorithm.md", tmp_path) == 1


@pytest.mark.e2e
def test_the_checkpoint_page_runs_as_written(tmp_path):
    assert run_page("checkpoints.md", tmp_path) == 3


def test_troubleshooting_names_every_error_type():
    text = (DOCS / "troubleshooting.md").read_text()
    errors = [n for n, c in vars(hybridflow.errors).items()
              if inspect.isclass(c) and issubclass(c, hybridflow.errors.HybridflowError)]
    missing = [n for n in errors if f"### `{n}`" not in text]
    assert not missing and len(errors) >= 18, missing


def test_mkdocs_build_strict(tmp_path):
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-q", "-d", str(tmp_path / "site")],
                          cwd=ROOT, capture_output=True, text=True, timeout=600,
                          env={**__import__("os").environ, "NO_MKDOCS_2_WARNING": "1", "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    print(f"mkdocs build --strict: {time.perf_counter() - start:.1f} s")
    for page in ("tutorial", "configuration", "api", "troubleshooting"):
        assert (tmp_path / "site" / page / "index.html").is_file()
    assert "rloo_lenpen" in (tmp_path / "site" / "tutorial" / "index.html").read_text()
