"""hybridflow_ops: the RL operators of hybridflow as pure tensor functions.

Every op takes tensors and masks, keyword-only hyper-parameters, returns a
named tuple, never mutates its inputs, and is registered by name in
:mod:`hybridflow_ops.registry` with its typed input and output fields.
This package imports torch, never ``hybridflow``.
"""
from .registry import FieldSpec, OpRegistryError, OpSpec, get_op, has_op, list_ops, register_op, unregister_op
from .masked import masked_mean, masked_sum, masked_var, masked_whiten

__all__ = [
    "FieldSpec", "OpRegistryError", "OpSpec", "get_op", "has_op", "list_ops", "register_op", "unregister_op",
    "masked_mean", "masked_sum", "masked_var", "masked_whiten",
]
