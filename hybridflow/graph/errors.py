"""The specific errors of the graph layer.

Each is a subclass of one of the project's exception types in
:mod:`hybridflow.errors`, so ``except GraphValidationError`` (or
``except HybridflowError``) catches them all. Every one names the node and
the field at fault where there is one, and carries a ``hint`` that says how to
fix it.
"""
from __future__ import annotations

from hybridflow_ops.registry import OpRegistryError

from ..errors import GraphValidationError, OpError, TraceError

__all__ = [
    "CycleError",
    "GroupSizeError",
    "OpRegistrationError",
    "NodeOrderError",
    "DuplicateNodeError",
    "MissingFieldError",
    "AmbiguousFieldError",
    "TypeMismatchError",
    "UnknownOpError",
    "OpKindError",
    "UnknownAttrError",
    "UndeclaredRoleError",
    "RoleKindError",
    "FrozenRoleUpdateError",
    "DoubleUpdateError",
    "UpdateOrderError",
    "UnusedValueWarning",
]


class CycleError(GraphValidationError):
    """The nodes read each other's outputs in a loop; a graph is one acyclic iteration."""


class NodeOrderError(GraphValidationError):
    """The graph is acyclic but its nodes are not listed in a topological order."""


class DuplicateNodeError(GraphValidationError):
    """Two nodes (or a node and a graph input) share a name."""


class MissingFieldError(GraphValidationError):
    """A node reads a field that no node (or graph input) produces."""


class AmbiguousFieldError(GraphValidationError, TraceError):
    """At trace time, two of the values given to an op carry the same field from different producers."""


class TypeMismatchError(GraphValidationError):
    """A field's dtype or dims disagree with what the op declares, or dims that must agree do not."""


class UnknownOpError(GraphValidationError, OpError):
    """A node names an op that is not registered (or not valid for its node kind)."""


class OpKindError(GraphValidationError, OpError):
    """A registered op is used in the wrong place, e.g. a loss op in a compute node."""


class UnknownAttrError(GraphValidationError, OpError):
    """A node passes an attribute its op does not take, or a value that is not a JSON scalar."""


class UndeclaredRoleError(GraphValidationError):
    """A node runs on a role that the graph does not declare."""


class RoleKindError(GraphValidationError):
    """A role's model kind cannot run this node (a reward model cannot generate, ...)."""


class FrozenRoleUpdateError(GraphValidationError):
    """An update node targets a role declared frozen (reference, reward, cost)."""


class DoubleUpdateError(GraphValidationError):
    """A trainable role is updated more than once in one iteration."""


class UpdateOrderError(GraphValidationError):
    """A role's update does not come after every other node that reads that role's weights."""


class GroupSizeError(GraphValidationError):
    """A group estimator (an op that reads ``group_index``) gets groups of one response each: its advantages are all 0."""


class OpRegistrationError(OpError, OpRegistryError):
    """``hf.register_op`` refused an op: a malformed field declaration, a name already taken, a bad kind.

    Both a :class:`~hybridflow.errors.HybridflowError` (an ``OpError``) and the ops package's own
    ``OpRegistryError`` (which :mod:`hybridflow_ops`, knowing nothing of hybridflow, raises), so either
    ``except`` catches it.
    """


class UnusedValueWarning(UserWarning):
    """A node produces a value that no other node reads."""
