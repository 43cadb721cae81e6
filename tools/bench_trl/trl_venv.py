"""TRL's side environment for tools/bench_vs_trl.py: TRL is never a dependency of hybridflow."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

TRL_VERSION = "1.16.0"
"""The TRL release the side environment pins."""
TRL_VENV = Path(__file__).resolve().parents[2] / ".venv-trl"
"""The side environment's default folder (git-ignored)."""


def missing_trl(venv: Path) -> str:
    """What to do when ``venv`` has no TRL (the message a mode that needs it stops with)."""
    return (f"TRL's side environment {venv} {'has no' if venv.exists() else 'does not exist, so no'} trl=={TRL_VERSION}: "
            f"add --make-trl-venv to make it (pip installs trl=={TRL_VERSION} over this environment's torch), or run "
            "'learn --sides hybridflow' for hybridflow's side alone")


def ensure_trl_venv(venv: Path, make: bool) -> Path:
    """The side environment's python; with ``make``, made first if needed: TRL over this environment's packages.

    Without ``make`` a missing environment stops the tool with :func:`missing_trl`'s message.
    The new venv sees this environment's site-packages through a ``.pth`` file (appended after its
    own), so pip finds this torch (the local CPU build) and transformers installed and downloads only
    TRL and what it adds (accelerate, datasets, ...); a package TRL needs in another version is
    installed into the side venv, which then shadows ours there only.
    """
    import sysconfig

    python = venv / "bin" / "python"
    check = [str(python), "-c", f"import trl, sys; sys.exit(trl.__version__ != {TRL_VERSION!r})"]
    if python.exists() and subprocess.run(check, capture_output=True).returncode == 0:
        return python
    if not make:
        raise SystemExit(missing_trl(venv))
    print(f"making {venv} with trl=={TRL_VERSION} over this environment's torch ...", flush=True)
    try:
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        site = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                              check=True, capture_output=True, text=True).stdout.strip()
        Path(site, "hybridflow_env.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
        subprocess.run([str(python), "-m", "pip", "install", "-q", f"trl=={TRL_VERSION}"], check=True)
        subprocess.run(check, check=True)
    except subprocess.CalledProcessError as err:
        raise SystemExit(f"could not make {venv} ({' '.join(map(str, err.cmd))} exited {err.returncode}); "
                         f"install trl=={TRL_VERSION} into it by hand, or pass another --trl-venv") from None
    return python
