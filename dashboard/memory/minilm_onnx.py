"""MiniLM's six encoder layers as an ONNX graph over the same weights, run by ONNX Runtime:
twice NumPy's speed on chat pairs, the same vectors (to ~2e-7). The embeddings and the
pooling stay in NumPy (cheap). A session is made per process, on its first batch: a work
horse makes its own after the fork (retrieval.md)."""

from __future__ import annotations

import math
import os
import weakref
from typing import Any

import numpy as np

HEADS_SHAPE, HIDDEN_SHAPE = "shape_heads", "shape_hidden"


def onnx_available() -> bool:
    try:
        import onnx  # noqa: F401
        import onnxruntime  # noqa: F401
    except ImportError:
        return False
    return True


def build_graph(layers: list[dict[str, Any]], hidden: int, heads: int, eps: float) -> bytes:
    """The serialized model: inputs ``x`` (batch, length, hidden) after the embeddings'
    layer norm and ``mask`` (batch, 1, 1, length, added to the attention scores); output
    ``y``, the last layer's states."""
    from onnx import TensorProto, helper, numpy_helper

    head = hidden // heads
    nodes, weights = [], []

    def const(name: str, array: np.ndarray) -> str:
        weights.append(numpy_helper.from_array(np.ascontiguousarray(array), name))
        return name

    def node(op: str, inputs: list[str], outputs: list[str], **attributes: Any) -> Any:
        nodes.append(helper.make_node(op, inputs, outputs, **attributes))
        return outputs[0] if len(outputs) == 1 else outputs

    const(HEADS_SHAPE, np.array([0, 0, heads, head], dtype=np.int64))
    const(HIDDEN_SHAPE, np.array([0, 0, hidden], dtype=np.int64))
    const("scale", np.array(1 / math.sqrt(head), dtype=np.float32))
    const("thirds", np.array([hidden] * 3, dtype=np.int64))
    x = "x"
    for number, layer in enumerate(layers):
        p = f"l{number}_"

        def split_heads(t: str, perm: list[int]) -> str:
            return node("Transpose", [node("Reshape", [t, HEADS_SHAPE], [t + "_r"])],
                        [t + "_t"], perm=perm)

        qkv = node("Add", [node("MatMul", [x, const(p + "qkv", layer["qkv"])], [p + "qkv"
                                                                                 "_m"]),
                           const(p + "qkv_b", layer["qkv_bias"])], [p + "qkv_a"])
        q, k, v = node("Split", [qkv, "thirds"], [p + "q", p + "k", p + "v"], axis=-1)
        scores = node("MatMul", [split_heads(q, [0, 2, 1, 3]), split_heads(k, [0, 2, 3, 1])],
                      [p + "s"])
        scores = node("Add", [node("Mul", [scores, "scale"], [p + "ss"]), "mask"], [p + "sm"])
        scores = node("Softmax", [scores], [p + "sp"], axis=-1)
        context = node("MatMul", [scores, split_heads(v, [0, 2, 1, 3])], [p + "c"])
        context = node("Reshape", [node("Transpose", [context], [p + "ct"], perm=[0, 2, 1, 3]),
                                   HIDDEN_SHAPE], [p + "cr"])
        out = node("Add", [node("MatMul", [context, const(p + "out", layer["out"])], [p + "o"]),
                           const(p + "out_b", layer["out_bias"])], [p + "ob"])
        x1 = node("LayerNormalization", [node("Add", [out, x], [p + "r1"]),
                                         const(p + "n1w", layer["norm1"][0]),
                                         const(p + "n1b", layer["norm1"][1])],
                  [p + "x1"], axis=-1, epsilon=eps)
        up = node("Add", [node("MatMul", [x1, const(p + "up", layer["up"])], [p + "u"]),
                          const(p + "up_b", layer["up_bias"])], [p + "ub"])
        down = node("Add", [node("MatMul", [node("Gelu", [up], [p + "g"]),
                                            const(p + "down", layer["down"])], [p + "d"]),
                            const(p + "down_b", layer["down_bias"])], [p + "db"])
        x = node("LayerNormalization", [node("Add", [down, x1], [p + "r2"]),
                                        const(p + "n2w", layer["norm2"][0]),
                                        const(p + "n2b", layer["norm2"][1])],
                 [p + "x2"], axis=-1, epsilon=eps)
    node("Identity", [x], ["y"])
    graph = helper.make_graph(
        nodes, "minilm-encoder",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "length", hidden]),
         helper.make_tensor_value_info("mask", TensorProto.FLOAT, ["batch", 1, 1, "length"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", "length", hidden])],
        weights)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)])
    model.ir_version = 9  # what every onnxruntime from 1.16 reads
    return model.SerializeToString()


class Sessions:
    """One session per process. A session's thread pool does not survive a fork, and a
    session made after the fork in a process whose parent had one waited forever (seen):
    so every session is closed just before this process forks (``os.register_at_fork``),
    and each side makes a new one at its next batch (~0.2 s)."""

    _all: weakref.WeakSet[Sessions] = weakref.WeakSet()

    def __init__(self, graph: bytes) -> None:
        self.graph = graph
        self._session: Any = None
        Sessions._all.add(self)

    def get(self) -> Any:
        if self._session is None:
            self._session = make_session(self.graph)
        return self._session

    @classmethod
    def close_all(cls) -> None:
        for sessions in list(cls._all):
            sessions._session = None


os.register_at_fork(before=Sessions.close_all)


def make_session(graph: bytes) -> Any:
    """A CPU session whose threads sleep when idle (no spinning: a work horse is one of
    several processes on few cores), with no memory arena: it kept ~200 MB more per process
    after a batch, for no speed measured."""
    import onnxruntime

    options = onnxruntime.SessionOptions()
    options.inter_op_num_threads = 1
    options.execution_mode = onnxruntime.ExecutionMode.ORT_SEQUENTIAL
    options.enable_cpu_mem_arena = False
    options.enable_mem_pattern = False
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    options.add_session_config_entry("session.inter_op.allow_spinning", "0")
    return onnxruntime.InferenceSession(graph, options, providers=["CPUExecutionProvider"])
