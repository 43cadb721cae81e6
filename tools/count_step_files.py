"""Count the ``hybridflow/`` files one training step crosses, from ``hybridflow run`` down to the ops.

Runs ``hybridflow run CONFIG`` (default: the quickstart's run file, shortened to 3 steps with no
validation or checkpoint in between) with a ``sys.setprofile`` hook that records the source file of
every Python function called while step 2 runs: from the trainer loop's call of ``train_step`` for
step 2 to its call for step 3 (step 1 is the warm-up: first calls build caches). Prints the files,
relative to the repository, and two counts: every ``hybridflow/`` file, and the *path* — those files
less the engines the ops run in (``hybridflow/runtime/engines/``): what a step crosses to reach them.
``hybridflow_ops`` (the tensor math) is not counted.

It also prints the **call chains to the ops**: at every call of a function of ``hybridflow_ops`` during the
step, the files on the stack from ``hybridflow run`` (``hybridflow/cli.py``) down to the op, each file once in
the order the call passes through it. The union counts every file a step *touches* (a leaf helper such as
``Batch.__len__`` included); a chain counts the files a request *crosses* on its way to an op. It prints the
longest chain and the files on any chain.

    python tools/count_step_files.py                     # the quickstart's PPO, 3 steps
    python tools/count_step_files.py CONFIG.yaml k=v ... # another run file (steps=3 is added)
"""
from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "hybridflow"
ENGINES = "hybridflow/runtime/engines/"
OPS = ROOT / "hybridflow_ops"
DEFAULT_CONFIG = ROOT / "examples" / "configs" / "quickstart.yaml"
SHORT = ("max_steps=3", "eval_freq=0", "save_freq=0", "rollout_batch_size=8", "n_samples=4", "batch_size=32",
         "log_every=100", "progress_bar=false")
"""Overrides that make the run three short steps, with no validation or checkpoint between them."""


class StepFiles:
    """A profile hook: the package files whose functions are called during step ``step`` of the trainer loop."""

    def __init__(self, step: int = 2):
        self.step = step
        self.active = False
        self.files: set[str] = set()
        self.chains: set[tuple[str, ...]] = set()

    def __call__(self, frame, event, arg) -> None:
        if event != "call":
            return
        code = frame.f_code
        if code.co_name == "train_step" and code.co_filename.endswith("trainer/trainer.py"):
            trainer = frame.f_locals.get("self")
            self.active = getattr(trainer, "step", None) == self.step
        if self.active and code.co_filename.startswith(f"{PACKAGE}/"):
            self.files.add(str(Path(code.co_filename).relative_to(ROOT)))
        if self.active and code.co_filename.startswith(f"{OPS}/") and not _called_from_ops(frame):
            self.chains.add(_chain(frame))


def _project_file(filename: str) -> str | None:
    return str(Path(filename).relative_to(ROOT)) if filename.startswith((f"{PACKAGE}/", f"{OPS}/")) else None


def _called_from_ops(frame) -> bool:
    """The op is called by another op (a helper of hybridflow_ops): its chain is the outer op's."""
    caller = frame.f_back
    return caller is not None and caller.f_code.co_filename.startswith(f"{OPS}/")


def _chain(frame) -> tuple[str, ...]:
    """The project files on the stack of ``frame``, outermost first, each once."""
    files: list[str] = []
    while frame is not None:
        name = _project_file(frame.f_code.co_filename)
        if name is not None and name not in files:
            files.append(name)
        frame = frame.f_back
    return tuple(reversed(files))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("config", nargs="?", default=str(DEFAULT_CONFIG), help="YAML run file")
    parser.add_argument("overrides", nargs="*", help="key=value overrides")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(ROOT))
    from hybridflow.cli import main as hybridflow_main

    hook = StepFiles()
    with tempfile.TemporaryDirectory() as out:
        overrides = [*SHORT, f"output_dir={out}", *args.overrides]
        sys.setprofile(hook)
        try:
            code = hybridflow_main(["run", args.config, *overrides])
        finally:
            sys.setprofile(None)
    if code:
        print(f"hybridflow run exited with {code}", file=sys.stderr)
        return code
    path = sorted(f for f in hook.files if not f.startswith(ENGINES))
    for name in sorted(hook.files):
        print(name, "" if name in path else "(engine)")
    print(f"{len(hook.files)} hybridflow/ files crossed by one training step; {len(path)} on the path to the "
          f"engines (less {ENGINES})")
    if hook.chains:
        longest = max(hook.chains, key=len)
        on_chains = sorted({f for chain in hook.chains for f in chain if not f.startswith("hybridflow_ops/")})
        print(f"\ncall chains from 'hybridflow run' to the ops: {len(hook.chains)}; the longest crosses "
              f"{len(longest) - 1} hybridflow/ files to reach its op:\n  " + "\n  -> ".join(longest))
        print(f"{len(on_chains)} hybridflow/ files are on a chain to an op:\n  " + "\n  ".join(on_chains))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
