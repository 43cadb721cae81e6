"""The executors' transport (``send``, ``ready``, ``wait``, ``fetch``) is all the plan interpreter needs of a backend.

A backend written against the public interface alone: its calls do not run when sent but one at a time, oldest
first, when the interpreter waits, which is how a remote backend looks to the interpreter (results arrive
later, in their own time). It must run the plan to exactly the LocalExecutor's result.
"""
from __future__ import annotations

import torch

from hybridflow.algorithms import ALGORITHMS
from hybridflow.runtime.local import LocalExecutor

from test_local_executor import _prompts, _specs, local_plan_for


class Deferred:
    """A call sent but not run yet (``done`` is False until a wait runs it)."""

    def __init__(self, run):
        self.run, self.done, self.result = run, False, None


class DeferredExecutor(LocalExecutor):
    """The LocalExecutor's slots behind a transport whose calls run only when waited on."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.sent: list[Deferred] = []
        self.waits = 0

    def send(self, slot, method, *args):
        call = Deferred(lambda: LocalExecutor.send(self, slot, method, *args))
        self.sent.append(call)
        return call

    def ready(self, refs):
        return [ref.done for ref in refs]

    def wait(self, refs, timeout):
        self.waits += 1
        oldest = next(call for call in self.sent if not call.done)  # in the order sent: a sync's send before its receive
        oldest.result, oldest.done = oldest.run(), True

    def fetch(self, ref, slot, what):
        assert ref.done, "fetched before it was ready"
        return LocalExecutor.fetch(self, ref.result, slot, what)


def test_a_backend_written_against_the_transport_runs_a_plan_as_the_local_executor_does():
    graph = ALGORITHMS["ppo"].build()
    plan = local_plan_for(graph, placement={"actor": "cpu", "critic": "cpu", "ref": "cpu", "reward": "cpu"})
    torch.manual_seed(0)
    expected = LocalExecutor(plan, _specs(graph)).run_iteration({"prompts": _prompts()})
    torch.manual_seed(0)
    deferred = DeferredExecutor(plan, _specs(graph))
    got = deferred.run_iteration({"prompts": _prompts()})
    assert deferred.sent and all(call.done for call in deferred.sent)
    assert deferred.waits == len(deferred.sent)  # every call ran in a wait: none was run when sent
    assert got.metrics == expected.metrics
    assert set(got.env) == set(expected.env)
    for name, batch in expected.env.items():
        for field in batch.tensors.keys():
            assert torch.equal(got.env[name][field], batch[field]), (name, field)
