"""A CLIP text tower written directly as an ONNX Runtime graph, for :func:`.onnx.export_onnx`.

It computes what transformers' ``CLIPModel.get_text_features`` followed by L2 normalisation does
(``export_onnx`` checks it against torch and falls back to the traced export above its tolerance),
built for a query at batch 1:

- **about a dozen nodes a layer**: ONNX Runtime's fused ``Attention`` (``com.microsoft``: the query,
  key and value projections in one product, the causal and padding masks inside), then MatMul + bias,
  ``QuickGelu``, ``LayerNormalization``. The traced export holds ~56 nodes a layer, most of them
  the shape arithmetic of reshapes; each is a dispatch and, on several threads, a hand-off between
  them.
- **the activations as rows** ``[batch * sequence, width]``, given three axes only for ``Attention``:
  on rows ONNX Runtime fuses each MatMul + bias into one ``Gemm`` (after a three-axis MatMul the bias
  stays a separate ``Add``, ~3 % of a batch-1 query on one thread; the graph as written still holds
  the MatMul that int8 quantisation replaces).
- **the last layer for the pooled row only**: CLIP's text embedding is the last layer's activation at
  the end-of-text token, layer-normalised and projected (Radford et al. 2021, sec. 2.4), and under the
  causal mask no other row of the last layer reaches it; that layer computes keys and values for every
  token and its query, attention output and MLP for the pooled row alone.

Built only for a plain ``CLIPModel`` text tower (``quick_gelu`` or ``gelu``); anything else
(:func:`clip_text_graph` returns None) is exported by tracing.
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["OPSET", "clip_text_graph"]

#: the ONNX opset of the graph (and ``com.microsoft`` 1)
OPSET = 18

#: the contrib-op domain of ONNX Runtime (Attention, QuickGelu)
MS = "com.microsoft"


class _Graph:
    """Nodes and initialisers of a graph under construction."""

    def __init__(self) -> None:
        self.nodes: list[Any] = []
        self.inits: list[Any] = []

    def const(self, name: str, value: Any) -> str:
        from onnx import numpy_helper

        if hasattr(value, "detach"):
            value = value.detach().float().cpu().numpy()
        self.inits.append(numpy_helper.from_array(np.ascontiguousarray(value), name))
        return name

    def op(self, op_type: str, inputs: list[str], out: str | list[str], domain: str = "", **attrs: Any) -> Any:
        from onnx import helper

        outs = [out] if isinstance(out, str) else out
        self.nodes.append(helper.make_node(op_type, inputs, outs, domain=domain, **attrs))
        return out

    def linear(self, x: str, weight: Any, bias: Any, name: str) -> str:
        """``x @ weight.T + bias`` (torch's Linear layout) of the rows ``x`` (two axes)."""
        y = self.op("MatMul", [x, self.const(f"{name}.w", weight.T)], f"{name}.xw")
        return self.op("Add", [y, self.const(f"{name}.b", bias)], name)

    def add_norm(self, x: str, residual: str, norm: Any, eps: float, name: str) -> tuple[str, str]:
        """``(LayerNorm(x + residual), x + residual)``."""
        h = self.op("Add", [x, residual], f"{name}.h")
        y = self.op("LayerNormalization", [h, self.const(f"{name}.g", norm.weight), self.const(f"{name}.beta", norm.bias)],
                    f"{name}.y", axis=-1, epsilon=eps)
        return y, h


def _supported(encoder: Any) -> bool:
    """True for a plain transformers CLIP text tower this module can write."""
    from transformers import CLIPModel
    from transformers.models.clip.modeling_clip import CLIPEncoderLayer

    from .clip import CLIPDualEncoder

    model = getattr(encoder, "model", None)
    if type(encoder) is not CLIPDualEncoder or type(model) is not CLIPModel:
        return False
    text = model.text_model  # CLIPTextModel (transformers 5) or CLIPTextTransformer (4)
    return (all(hasattr(text, a) for a in ("embeddings", "encoder", "final_layer_norm", "config"))
            and text.config.hidden_act in ("quick_gelu", "gelu")
            and all(type(layer) is CLIPEncoderLayer for layer in text.encoder.layers)
            and model.text_projection.bias is None)


def _eos_index(g: _Graph, eos_token_id: int) -> str:
    """``[batch, 1]``: the pooled token's position, by transformers' rule (the largest id for the
    legacy ``eos_token_id == 2``; else the first end-of-text token)."""
    if eos_token_id == 2:
        ids = g.op("Cast", ["input_ids"], "ids32", to=6)
    else:
        is_eos = g.op("Equal", ["input_ids", g.const("eos_id", np.array(eos_token_id, np.int64))], "is_eos")
        ids = g.op("Cast", [is_eos], "is_eos32", to=6)
    return g.op("ArgMax", [ids], "eos", axis=1, keepdims=1)


def _pooled_row(g: _Graph, rows: str, index: str, name: str) -> str:
    """``{name}_eos``: the pooled token's row of each query (``[batch, d]``) from ``rows`` (``[batch *
    sequence, d]``); ``index``: its position, ``[batch, 1, d]``."""
    three = g.op("Reshape", [rows, "shape3"], f"{name}3")
    return g.op("Reshape", [g.op("GatherElements", [three, index], f"{name}_eos3", axis=1), "flat"], f"{name}_eos")


def _pooled_attention(g: _Graph, x: str, attn: Any, heads: int, name: str) -> str:
    """Self-attention of the last layer for the pooled row ``{name}.x_eos`` only (``[batch, d]``):
    keys and values of every token of ``x`` (``[batch * sequence, d]``), masked to the real tokens at or
    before it."""
    d = attn.q_proj.weight.shape[0]
    hd = d // heads
    i64 = lambda *v: np.array(v, np.int64)  # noqa: E731
    q = g.linear(f"{name}.x_eos", attn.q_proj.weight, attn.q_proj.bias, f"{name}.q")
    import torch

    kv = g.linear(x, torch.cat([attn.k_proj.weight, attn.v_proj.weight]), torch.cat([attn.k_proj.bias, attn.v_proj.bias]),
                  f"{name}.kv")
    positions = g.op("Range", [g.const("r0", np.array(0, np.int64)), "seq_scalar", g.const("r1", np.array(1, np.int64))],
                     "positions")
    keep = g.op("And", [g.op("LessOrEqual", [positions, "eos"], "causal"),
                        g.op("Cast", ["attention_mask"], "mask_bool", to=9)], "keep")
    key_bias = g.op("Where", [keep, g.const("f0", np.array(0, np.float32)), g.const("fmin", np.array(-1e30, np.float32))],
                    "key_bias")
    key_bias = g.op("Unsqueeze", [key_bias, g.const("ax12", i64(1, 2))], "key_bias4")  # [B, 1, 1, S]
    qh = g.op("Transpose", [g.op("Reshape", [q, g.const("qshape", i64(-1, 1, heads, hd))], "q4")], "qh", perm=[0, 2, 1, 3])
    kvshape = g.op("Concat", ["ids_shape", g.const("kvtail", i64(2, heads, hd))], "kvshape", axis=0)
    kvh = g.op("Transpose", [g.op("Reshape", [kv, kvshape], "kv5")], "kvh",
               perm=[2, 0, 3, 4, 1])  # [2, B, heads, hd, S]
    k, v = g.op("Split", [kvh], ["kT", "vT"], axis=0, num_outputs=2)
    k = g.op("Squeeze", [k, "zero"], "k")  # [B, heads, hd, S]
    v = g.op("Transpose", [g.op("Squeeze", [v, "zero"], "vt")], "v", perm=[0, 1, 3, 2])  # [B, heads, S, hd]
    scores = g.op("Mul", [g.op("MatMul", [qh, k], "qk"), g.const("scale", np.array(hd ** -0.5, np.float32))], "scores")
    p = g.op("Softmax", [g.op("Add", [scores, key_bias], "masked")], "p", axis=-1)
    o = g.op("Transpose", [g.op("MatMul", [p, v], "pv")], "pvt", perm=[0, 2, 1, 3])
    return g.op("Reshape", [o, g.const("oshape", i64(-1, d))], f"{name}.attn")


def clip_text_graph(encoder: Any) -> Any | None:
    """The ONNX model (``onnx.ModelProto``; inputs ``input_ids``, ``attention_mask``, int64 ``[batch,
    sequence]``; output ``embedding``, L2-normalised ``[batch, dim]``) of ``encoder``'s text tower,
    or None where it is not a plain CLIP text tower."""
    if not _supported(encoder):
        return None
    import torch
    from onnx import TensorProto, helper

    model = encoder.model
    text, cfg = model.text_model, model.text_model.config
    heads, eps = cfg.num_attention_heads, cfg.layer_norm_eps
    g = _Graph()
    i64 = lambda *v: np.array(v, np.int64)  # noqa: E731
    g.const("zero", i64(0))
    seq = g.op("Slice", [g.op("Shape", ["input_ids"], "ids_shape"), g.const("one", i64(1)), g.const("two", i64(2))], "seq")
    g.op("Squeeze", [seq, "zero"], "seq_scalar")
    pos = g.op("Slice", [g.const("pos_emb", text.embeddings.position_embedding.weight), "zero", seq, "zero"], "pos")
    h3 = g.op("Add", [g.op("Gather", [g.const("tok_emb", text.embeddings.token_embedding.weight), "input_ids"], "tok"), pos],
             "h0")
    width = int(text.config.hidden_size)
    g.op("Concat", ["ids_shape", g.const("width1", i64(width))], "shape3", axis=0)  # [batch, sequence, width]
    h = g.op("Reshape", [h3, g.const("flat", i64(-1, width))], "h0_rows")  # the rows from here on
    g.op("Cast", ["attention_mask"], "mask32", to=6)
    _eos_index(g, cfg.eos_token_id)  # "eos": [batch, 1], read by the pooled layer
    pending: str | None = None  # the previous MLP's output, added to the residual by the next norm
    layers = text.encoder.layers
    for i, layer in enumerate(layers):
        name, attn = f"l{i}", layer.self_attn
        if pending is None:
            x = g.op("LayerNormalization", [h, g.const(f"{name}.ln1.g", layer.layer_norm1.weight),
                                            g.const(f"{name}.ln1.beta", layer.layer_norm1.bias)], f"{name}.x", axis=-1, epsilon=eps)
        else:
            x, h = g.add_norm(pending, h, layer.layer_norm1, eps, f"{name}.ln1")
        if i < len(layers) - 1:
            qkv_w = torch.cat([attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight]).T
            qkv_b = torch.cat([attn.q_proj.bias, attn.k_proj.bias, attn.v_proj.bias])
            x3 = g.op("Reshape", [x, "shape3"], f"{name}.x3")
            a = g.op("Attention", [x3, g.const(f"{name}.qkv.w", qkv_w), g.const(f"{name}.qkv.b", qkv_b), "mask32"],
                     f"{name}.attn3", domain=MS, num_heads=heads, unidirectional=1)
            a = g.op("Reshape", [a, "flat"], f"{name}.attn")
        else:  # the pooled row from here on: [B, d]
            span = g.const("eos_shape", i64(1, 1, width))
            index = g.op("Expand", [g.op("Unsqueeze", ["eos", g.const("ax2", i64(2))], "eos3"), span], "eos_index")
            h = _pooled_row(g, h, index, f"{name}.h")
            _pooled_row(g, x, index, f"{name}.x")
            a = _pooled_attention(g, x, attn, heads, name)
        o = g.linear(a, attn.out_proj.weight, attn.out_proj.bias, f"{name}.out")
        x2, h = g.add_norm(o, h, layer.layer_norm2, eps, f"{name}.ln2")
        m = g.linear(x2, layer.mlp.fc1.weight, layer.mlp.fc1.bias, f"{name}.fc1")
        m = (g.op("QuickGelu", [m], f"{name}.act", domain=MS, alpha=1.702) if cfg.hidden_act == "quick_gelu"
             else g.op("Gelu", [m], f"{name}.act", domain=MS))
        pending = g.linear(m, layer.mlp.fc2.weight, layer.mlp.fc2.bias, f"{name}.fc2")
    assert pending is not None
    final, _ = g.add_norm(pending, h, text.final_layer_norm, eps, "final")
    projected = g.op("MatMul", [final, g.const("projection", model.text_projection.weight.T)], "projected")
    g.op("LpNormalization", [projected], "embedding", axis=-1, p=2)
    dim = int(model.text_projection.weight.shape[0])
    graph = helper.make_graph(
        g.nodes, "clip_text_tower",
        [helper.make_tensor_value_info(n, TensorProto.INT64, ["batch", "sequence"]) for n in ("input_ids", "attention_mask")],
        [helper.make_tensor_value_info("embedding", TensorProto.FLOAT, ["batch", dim])], g.inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET), helper.make_opsetid(MS, 1)],
                             producer_name="nobackfill")
