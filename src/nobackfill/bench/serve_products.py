"""A floor for the time of any fp32 graph of a CLIP text tower, for ``nobackfill bench serve``: only
the products of its weights, on ONNX Runtime (:func:`products_floor`)."""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

__all__ = ["products_floor"]


def products_floor(encoder: Any, threads: int) -> Callable[[list[str]], Any]:
    """A floor for any fp32 graph of ``encoder``'s CLIP text tower: ``encode(texts)`` runs, on ONNX
    Runtime (``threads`` intra-op threads, idle ones sleeping), only the products of its weights that
    the export's graph (:mod:`nobackfill.encoders.onnx_clip`) computes for a query of that many tokens,
    chained, with the model's own weights: per layer the query/key/value, output and two MLP
    products over every token, the last layer's keys and values over every token and the rest for
    the pooled row, then the projection. Attention, norms, activations are left out; a query's time
    is mostly these products, and their weights (~150 MB in fp32 at ViT-B/32 size) are read from
    memory once per query."""
    import onnxruntime as ort
    import torch
    from onnx import TensorProto, helper, numpy_helper

    text = encoder.model.text_model
    layers, nodes, inits, x = list(text.encoder.layers), [], [], "x"

    def product(inp: str, weight: Any, name: str) -> str:
        inits.append(numpy_helper.from_array(np.ascontiguousarray(weight.detach().float().numpy().T), f"{name}.w"))
        nodes.append(helper.make_node("MatMul", [inp, f"{name}.w"], [name]))
        return name

    outputs = []
    for i, layer in enumerate(layers):
        a = layer.self_attn
        if i == len(layers) - 1:  # keys and values over every token; the rest for the pooled row
            outputs.append(product(x, torch.cat([a.k_proj.weight, a.v_proj.weight]), f"l{i}.kv"))
            nodes.append(helper.make_node("Slice", [x, "zero", "one", "one"], [f"l{i}.row"]))  # [batch, 1, width]
            x = f"l{i}.row"
            outputs.append(product(x, a.q_proj.weight, f"l{i}.q"))
        else:
            outputs.append(product(x, torch.cat([a.q_proj.weight, a.k_proj.weight, a.v_proj.weight]), f"l{i}.qkv"))
        x = product(product(product(x, a.out_proj.weight, f"l{i}.out"), layer.mlp.fc1.weight, f"l{i}.fc1"),
                    layer.mlp.fc2.weight, f"l{i}.fc2")
    x = product(x, encoder.model.text_projection.weight, "projected")
    inits += [numpy_helper.from_array(np.array([v], np.int64), n) for n, v in (("zero", 0), ("one", 1))]  # (axis 1)
    width = int(layers[0].self_attn.q_proj.weight.shape[1])
    graph = helper.make_graph(nodes, "products",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "tokens", width])],
                              [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in [*outputs, x]], inits)
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    session = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])

    def encode(texts: list[str]) -> Any:
        ids = encoder.tokenizer(list(texts), truncation=True, max_length=encoder.max_length)["input_ids"]
        return session.run(None, {"x": np.zeros((len(ids), max(map(len, ids)), width), np.float32)})  # padded, as a batch is

    return encode
