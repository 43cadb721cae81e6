"""The project's exception types.

Every error a user can cause (a malformed graph, a wrong config, an impossible
placement, an unreachable reward server, a NaN reward, a corrupt checkpoint)
is raised as one of these, with a message that names what is wrong and how to
fix it. Catch :class:`HybridflowError` to catch them all.
"""
from __future__ import annotations

__all__ = [
    "HybridflowError",
    "GraphError",
    "GraphValidationError",
    "StalenessError",
    "TraceError",
    "OpError",
    "ConfigError",
    "UnknownAlgorithmError",
    "PlacementError",
    "PlanError",
    "ExecutionError",
    "RewardError",
    "DataError",
    "CheckpointError",
    "ModelLoadError",
    "BatchError",
    "WorkerLostError",
    "HangError",
    "OutputDirError",
    "RunFolderError",
    "WriteError",
    "ContractError",
    "AgentError",
]


class HybridflowError(Exception):
    """Base of every error hybridflow raises on purpose."""


class GraphError(HybridflowError):
    """A graph cannot be built, read or written (malformed JSON or text form, bad record)."""


class GraphValidationError(GraphError):
    """A graph is well formed but wrong: a cycle, a missing field, a type mismatch, ...

    ``node`` and ``field`` name the offending node and field where there is one.
    """

    def __init__(self, message: str, *, node: str | None = None, field: str | None = None, hint: str | None = None):
        self.node, self.field, self.hint = node, field, hint
        where = " ".join(p for p in (f"node {node!r}" if node else "", f"field {field!r}" if field else "") if p)
        text = f"{where}: {message}" if where else message
        super().__init__(f"{text}\n  hint: {hint}" if hint else text)


class StalenessError(GraphValidationError):
    """Lagged data reaches a loss the wrong way: a policy-gradient loss reads data sampled by older weights
    (a plan with ``staleness`` k > 0) with no off-policy correction, or a correction reads the behaviour
    log-probs from something other than the rollout node that sampled the responses.

    Names the update node, the lagged edge and its lag (``lag``), and lists the corrections the op registry
    holds, with the fix. See :mod:`hybridflow.graph.staleness`.
    """

    def __init__(self, message: str, *, node: str | None = None, field: str | None = None, hint: str | None = None,
                 lag: int = 0):
        self.lag = lag
        super().__init__(message, node=node, field=field, hint=hint)


class TraceError(GraphError):
    """The algorithm function could not be traced into a graph."""


class OpError(HybridflowError):
    """An op is unknown, or was called with the wrong fields or attributes."""


class ConfigError(HybridflowError, ValueError):
    """A configuration value is invalid; the message names the field path."""


class UnknownAlgorithmError(ConfigError, GraphError):
    """A name given as the algorithm is no built-in, no ``package.module:function`` and no graph file."""


class PlacementError(HybridflowError):
    """No placement satisfies the constraints (memory, divisibility, device count)."""


class BindError(PlacementError):
    """A plan names devices the machine it is bound to does not have (which pool, how many, what was found)."""


class PlanError(HybridflowError):
    """An ExecutionPlan is malformed, or a compiler pass broke one of its invariants."""


class ExecutionError(HybridflowError):
    """An op failed while running a plan; names the op, node, role and device."""


class RewardError(HybridflowError):
    """A reward source failed: unreachable server, malformed reply, NaN score."""


class DataError(HybridflowError):
    """A dataset is missing, unreadable, or lacks a required column."""


class CheckpointError(HybridflowError):
    """A checkpoint is missing, partial or corrupt."""


class ModelLoadError(HybridflowError):
    """A model or tokenizer cannot be loaded: missing folder, unreachable hub, unreadable files."""


class BatchError(HybridflowError):
    """A Batch operation got mismatched lengths, a missing field, or conflicting field values."""


class WorkerLostError(ExecutionError):
    """A worker process died (killed, out of memory, node lost); names its role(s), rank and pool."""


class HangError(ExecutionError):
    """No op of a plan completed for ``hang_timeout_s`` seconds and ``on_hang`` is ``stop``: names the ops in
    flight and their pools; the watchdog's report (``RUN_DIR/hang.txt``) says what every pool and rank was
    doing, with the workers' and the controller's Python stacks."""


class OutputDirError(HybridflowError):
    """An output folder cannot be used: another run holds it, it holds an earlier run's checkpoints, or it is a file."""


class RunFolderError(OutputDirError):
    """A finished run's folder cannot be read (``hybridflow explain``, ``hybridflow diff``): it is not a run's
    output folder, or a file they need (plan.json, trace.json, config.json, hashes.jsonl) is missing or corrupt.
    Names the file and how to get it."""


class WriteError(OutputDirError):
    """A file could not be written: a full disk, a read-only folder, no permission, a file-size limit.

    Names what was being written, the file and the system's reason; ``errno`` is the OS error number.
    Files written before it are left as they were (a half-written record is removed).
    """

    _HINTS = {28: "free some space on that disk or give another output folder",
              27: "the file-size limit (ulimit -f) is reached; raise it or give another output folder",
              30: "the file system is mounted read-only; give a writable folder",
              13: "this user may not write there; give a writable folder",
              1: "this user may not write there; give a writable folder"}

    def __init__(self, what: str, err: OSError, path: object = None):
        self.errno = err.errno
        self.filename = str(path) if path is not None else err.filename
        where = f" {self.filename}" if self.filename else ""
        hint = self._HINTS.get(err.errno or 0)
        reason = err.strerror or str(err)
        super().__init__(f"{what}: cannot write{where}: {reason}" + (f"\n  hint: {hint}" if hint else ""))


class ContractError(ExecutionError):
    """A node produced an output that breaks its declaration: wrong dtype, a shape that does not fit the
    graph's dims, or a NaN/inf where finite values are declared; or an op wrote into one of its inputs
    (``side="input"``). Names the node, its op and the field.

    ``HYBRIDFLOW_CHECK_CONTRACTS=0`` (or the config's ``check_contracts: false``) turns these checks off.
    """

    def __init__(self, message: str, *, node: str, op: str, field: str | None = None, side: str = "output"):
        self.node, self.op, self.field = node, op, field
        where = f"node {node!r} (op {op!r})" + (f", {side} {field!r}" if field else "")
        super().__init__(f"{where}: {message}")


class AgentError(HybridflowError):
    """An agentic rollout cannot run: an unknown environment or tool, a bad tool-call format, an environment
    that breaks its interface (a step after done, a non-string observation) or a sandbox that cannot start.

    What a *model* does wrong inside a rollout (a malformed tool call, a tool that fails, a sandboxed program
    that loops forever) is never raised: it becomes an error observation the model reads on its next turn.
    """
