"""Suite-wide collection order: the longest tests first, then the other end-to-end runs, the Ray tests, the rest.

`make test` runs the suite on two pytest-xdist workers (``--dist loadgroup``). Its scheduler hands out
work units (one test, or one ``xdist_group``: a Ray test module, see tests/runtime/ray/conftest.py) in
collection order, each worker holding a few ahead; a multi-minute run handed out last would leave one
worker alone at the end. So the tests measured longest (``LONGEST``, slowest first) lead, the other
``e2e`` tests follow, then the Ray tests (those that end in a failure on purpose last: ``RAY_LAST``), and the
short tests fill in around them; within each rank the order is unchanged. A worker that reaches the short tests
stops its Ray instance (:func:`pytest_runtest_setup`).
pytest-xdist would otherwise reorder the units by how many tests each holds (``--loadscope-reorder``, its
default), which puts every multi-test Ray module ahead of the long single tests: that is turned off here.

The calibration cache (profiles of models on this machine, see hybridflow/compiler/calibrate.py)
goes to a folder of the test session, not the user's ~/.cache: a profile measured while the
suite loads the machine would otherwise make later real runs predict from it. The folder is made
once, in the process that starts the workers, so that both workers (and the processes they start)
share it: a profile one of them measured is not measured again by the other.

Where bytecode is not written (``PYTHONDONTWRITEBYTECODE``, as on some CI machines and sandboxes), every process
the suite starts would compile this checkout's ~150 modules from source again: each Ray worker, each command run as
a subprocess: ~0.17 s of CPU apiece, a few hundred times per suite (``tools/bench_bytecode.py``: importing the
trainer, the Ray executor and the worker took 2.69 s of CPU from source and 2.51 s from bytecode, medians of 6
processes each, interleaved; compiling both packages once costs ~0.3 s). So the process that starts the workers
writes the bytecode of ``hybridflow`` and ``hybridflow_ops`` once, where Python would have put it (``__pycache__``,
git-ignored; up-to-date files are left alone), and every process reads it; nothing else changes.

The fixtures of the tests that train (``tiny_model_dir``: a tiny random-weight model folder, made once per
process; ``fast_config``: a PPOConfig factory for a few quick steps on it) are at the end.
"""
from __future__ import annotations

import os
import tempfile

os.environ["HYBRIDFLOW_CACHE"] = os.environ.get("HYBRIDFLOW_TEST_CACHE") or tempfile.mkdtemp(prefix="hybridflow-test-cache-")
os.environ.setdefault("HYBRIDFLOW_TEST_CACHE", os.environ["HYBRIDFLOW_CACHE"])  # inherited by the xdist workers
# Ray replaces builtins.print for good in a process that started or joined Ray once a worker logs a progress
# bar (test_multinode's own cluster does); tests/trainer/test_checkpoint_files.py pickles print, so for the
# whole session (in every test process, whichever test starts Ray first) print stays print.
os.environ.setdefault("RAY_TQDM_PATCH_PRINT", "0")

import pytest  # noqa: E402
from cpu_log import pytest_runtest_protocol  # noqa: E402,F401  (HYBRIDFLOW_TEST_CPU_LOG=PREFIX: CPU seconds per test)
from hypothesis import HealthCheck, settings  # noqa: E402


def _write_bytecode_of_the_checkout() -> None:
    """Compile ``hybridflow`` and ``hybridflow_ops`` to ``__pycache__`` once, in the process that starts the workers,
    where the environment keeps Python from writing bytecode itself (see the module docstring)."""
    import sys

    if not sys.flags.dont_write_bytecode or os.environ.get("PYTEST_XDIST_WORKER"):
        return  # Python writes it as it imports; or the controller already did
    import compileall
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    for package in ("hybridflow", "hybridflow_ops"):
        try:
            compileall.compile_dir(root / package, quiet=2)
        except OSError:  # a read-only checkout: every process compiles in memory, as before
            return


_write_bytecode_of_the_checkout()

# Hypothesis checks nothing about time here: by default it fails an example that runs longer than
# 200 ms (``deadline``) and a strategy that generates slowly (``too_slow``), which on a loaded 2-core
# machine is a failure of the machine's speed, not of the code. Tests that set their own settings
# inherit these.
# In CI (``CI`` set, as by .ci/run) the examples are derandomized: a clean clone runs the same examples every
# time, so a red CI names a change, not a lucky draw. Elsewhere each run draws new ones, which is how the
# property and fuzz tests keep finding bugs (a failing draw is then kept in .hypothesis/ and replayed).
settings.register_profile("hybridflow", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("hybridflow-ci", parent=settings.get_profile("hybridflow"), derandomize=True)
settings.load_profile("hybridflow-ci" if os.environ.get("CI") else "hybridflow")

LONGEST = (
    "tests/docs/test_docs.py::test_the_tutorial_runs_as_written",
    "tests/trainer/test_quickstart.py::test_full_quickstart_raises_greedy_accuracy",
    "tests/runtime/ray/test_multinode.py::",
    "tests/e2e/test_grpo_arith.py::",
    "tests/docs/test_docs.py::test_the_checkpoint_page_runs_as_written",
    "tests/e2e/test_safe_rlhf_arith.py::test_without_the_multiplier",
    "tests/e2e/test_safe_rlhf_arith.py::test_cost_ends_under_the_limit",
)
"""Node-id prefixes of the slowest tests, slowest first (`--durations` of `make test` on 2 cores)."""


def pytest_configure(config):
    if hasattr(config.option, "loadscopereorder"):  # pytest-xdist installed: keep the order set below
        config.option.loadscopereorder = False


@pytest.hookimpl(wrapper=True)
def pytest_collection(session):
    """Let pytest keep the test modules it rewrote for its asserts (``__pycache__/*-pytest-*.pyc``, git-ignored) even
    where ``PYTHONDONTWRITEBYTECODE`` is set: rewriting and compiling the ~180 test modules costs each process that
    collects them (both xdist workers) ~3 s of CPU, which a later run of the same checkout then reads instead
    (``pytest --collect-only`` on a busy 2-core machine: 10.4 s of CPU without them, 7.3 s with them). Only the
    collection writes bytecode; the tests run as the environment asks."""
    import sys

    keep, sys.dont_write_bytecode = sys.dont_write_bytecode, False
    try:
        return (yield)
    finally:
        sys.dont_write_bytecode = keep


def _apply_xdist_groups(config, items) -> None:
    """On an xdist worker under ``--dist loadgroup``: end the node id of each test marked ``xdist_group(NAME)``
    with ``@NAME``, which is how the scheduler finds the groups. pytest-xdist 3.8 does this by setting
    ``item._nodeid``, which pytest 9 no longer reads (the id is ``item._id``), so there every group was
    silently ignored and its tests spread over both workers. Does nothing where pytest-xdist already did it."""
    if not getattr(config.option, "loadgroup", False):
        return
    for item in items:
        names = sorted({str(m.args[0] if m.args else m.kwargs.get("name", "default"))
                        for m in item.iter_markers("xdist_group")})
        suffix = "@" + "_".join(names)
        if names and not item.nodeid.endswith(suffix) and hasattr(item, "_id"):
            item._id = type(item._id).parse(item.nodeid + suffix)


def _is_ray_test(item) -> bool:
    """A test of a Ray module (tests/runtime/ray/conftest.py puts each in an ``xdist_group`` named ``ray-...``)."""
    return any(str(m.args[0] if m.args else m.kwargs.get("name", "")).startswith("ray-")
               for m in item.iter_markers("xdist_group"))


RAY_LAST = ("test_faults.py", "test_ray_trainer.py", "test_warm_workers.py", "test_hang_watchdog_ray.py")
"""Ray modules whose last run meets a failure on purpose (a killed worker, a hang): its slots are not parked
(hybridflow.runtime.ray.warm), so the next module on that worker would start every slot anew. They come after the
other Ray modules."""

SHORT = len(LONGEST) + 3
"""The rank of the short tests that use no Ray: they come last."""


def _rank(item) -> int:
    """``LONGEST`` in their order, the other ``e2e`` tests, the Ray tests (``RAY_LAST`` last), the short tests."""
    for at, prefix in enumerate(LONGEST):
        if item.nodeid.startswith(prefix):
            return at
    if _is_ray_test(item):
        return len(LONGEST) + (2 if item.nodeid.split("::")[0].endswith(RAY_LAST) else 1)
    return len(LONGEST) if item.get_closest_marker("e2e") is not None else SHORT


def pytest_collection_modifyitems(config, items):
    # runs after the other conftests' hooks of this name (those added the Ray modules' groups) and after xdist's
    _apply_xdist_groups(config, items)
    items.sort(key=_rank)


def pytest_runtest_setup(item):
    """A process that reaches the short tests has run every Ray test it will run (they are handed out in
    collection order, and the Ray modules come before the short tests), so it stops its Ray instance: an idle
    one, with the slots parked for the next Ray test, costs ~3% of a core for the rest of the session (Ray's
    daemons and idle workers polling), and holds their memory. A later test that wants Ray starts it again."""
    import sys

    if "ray" not in sys.modules or _rank(item) != SHORT:
        return
    import ray

    if ray.is_initialized():
        from hybridflow.runtime.ray.warm import stop_parked

        stop_parked()
        ray.shutdown()


# -- fixtures of the tests that train (tests/trainer, tests/commands, tests/faults, ...) ----------------

@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    from hybridflow.data import create_tiny_model_dir

    return str(create_tiny_model_dir(tmp_path_factory.mktemp("models") / "tiny", seed=0))


@pytest.fixture
def fast_config(tmp_path, tiny_model_dir):
    """``fast_config(**overrides)``: a PPOConfig for a few quick steps on the tiny arithmetic model."""
    from hybridflow import PPOConfig

    def make(**overrides):
        settings = dict(actor_model_name=tiny_model_dir, output_dir=str(tmp_path / "run"), max_steps=2,
                        rollout_batch_size=8, max_response_length=3, actor_lr=2e-3, critic_lr=1e-3, val_samples=2,
                        trackers=("jsonl",), progress_bar=False, num_threads=1)
        settings.update(overrides)
        return PPOConfig(**settings)

    return make
