"""ONNX Runtime's contrib `BeamSearch` operator (com.microsoft, model_type=1, encoder-decoder) over
our Transformer, measured against the server's own generator (`service.decoding.generator`):
docs/performance.md cites the figures this script prints.

    python -m benchmarks.beam_search_op --model models/de-en/1 --onnx-dir DIR --n 200 --rounds 3 --threads 1

`build_beam_search(model, path, precision)` writes one ONNX model whose only node is `BeamSearch`,
its encoder and decoder subgraphs written with onnx.helper from the weights (export.fused's
GraphBuilder: DynamicQuantizeMatMul per-channel int8, or fp32 MatMul). One `run` translates a
padded batch: encoder, every decoder step and the search happen inside ONNX Runtime.
The CLI builds the int8 graph in a temporary directory and times it, interleaved, against
`generate()` over the fused and the portable int8 graphs of DIR (an export with fused variants:
`mtserve export --precision all`): one sentence per call (median ms per sentence) and
length-sorted batches of 32 (sentences/s), greedy and beam 4. It also counts how many outputs of
the fp32 op graph equal `generate()`'s over the fused fp32 graphs. One JSON line on stdout.

What the contract needs (ORT 1.32, CPU; names and order are checked by the kernel):
- feeds: input_ids and attention_mask int32 (batch, S) (source ids + </s>, padded), max_length =
  the batch's largest per-sentence limit + 1 (it counts the leading <s>), min_length = 0 (optional
  in the schema, but without it `Run` fails with "Node input max_length is required"), num_beams,
  num_return_sequences = 1, length_penalty;
- `early_stopping=1`: a sentence stops once num_beams hypotheses ended, the reference's rule (with
  0 ORT goes on while a running beam could still beat the worst finished one, even at one beam);
- the decoder subgraph's input_ids has the static shape (batch, 1), else ORT feeds the whole
  sequence every step; heads and head size are static in the cache shapes (ORT reads them there)
  and so is the vocabulary in the logits';
- the per-sentence length rule (max_len = min(floor(a * src_len + b), max_positions - 1) tokens,
  </s> included, </s> forced at the last one) is built into the subgraphs' logits, from the
  attention mask: ORT's single max_length is one limit for the whole batch;
- `sequences` holds <s>, the tokens and padding, never the </s>; `sequences_scores` is
  sum(log p) / (len(tokens) + 1) ** length_penalty, the generator's beam score (greedy here runs
  with length_penalty 0: the plain sum, the generator's greedy score). A forced </s> scores
  log 1 = 0 (ORT log-softmaxes the forced logits), where the generator adds log p(</s>): only
  hypotheses that reach their limit differ (none of the first 200 test sentences with models/de-en/1;
  the tiny test model reaches it often).

Limitations found (why this is a benchmark and not a serving path):
- no shared past/present buffer on the CPU for model_type 1: DecoderMaskedMultiHeadAttention with
  past_sequence_length + beam_width + cache_indirection fails ("cache_indirection beam index out of
  range": the CPU kernel never initialises that buffer, the code is CUDA-only), and
  MultiHeadAttention with past_sequence_length runs but decodes garbage. Only the concatenating
  cache works: every step concatenates past and present and ORT gathers every cache by beam;
- cross keys/values are expanded per beam (batch x beams rows, attended per row): the fused
  graph's folding of a sentence's beams into one cross-attention query cannot be expressed;
- finished sentences stay in the batch, decoding padding until its longest sentence ends;
- no alignment (no cross-attention output), no streaming, no continuous batching (sentences
  cannot join or leave a running search), one length penalty per call;
- the embedding and decoder weights are stored twice, once per subgraph;
- a batch in which every sentence may emit only </s> (max_len 1) ends on the encoder subgraph's
  step, and ORT then runs the decoder once more on uninitialised token ids ("indices element out of
  data bounds"): `BeamSearchOp` refuses it (never the case with the default rule, b = 10).
"""

from __future__ import annotations

import argparse
import json
import math
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper

from export.fused.builder import GraphBuilder

REPO = Path(__file__).resolve().parent.parent

MS = "com.microsoft"
F, I32, I64 = TensorProto.FLOAT, TensorProto.INT32, TensorProto.INT64
PRECISIONS = ("fp32", "int8")
MAX_LEN_A, MAX_LEN_B = 1.5, 10  # the generator's defaults


def _np(t) -> np.ndarray:
    return t.detach().cpu().float().numpy()


def _heads(g: GraphBuilder, out: str, x: str, shape: str) -> str:
    """(B, T, D) -> (B, H, T, d_k) named `out`; `shape` the initializer [0, -1, H, d_k]."""
    r = g.node("Reshape", [x, shape], [f"{out}.r"], f"{out}.r")
    return g.node("Transpose", [r], [out], f"{out}.t", perm=[0, 2, 1, 3])


def _init_constants(g: GraphBuilder, model) -> None:
    """The initializers every subgraph shares (GraphBuilder does not deduplicate names)."""
    cfg = model.cfg
    D, H, dk = cfg.d_model, cfg.n_heads, cfg.d_k
    g.init("embed", _np(model.embed.weight) * math.sqrt(D))  # pre-scaled by √d_model
    g.init("pe", _np(model.pe))
    g.init("split3", np.array([D, D, D], np.int64))
    g.init("heads_shape", np.array([0, -1, H, dk], np.int64))


def _decoder_layers(g: GraphBuilder, model, x: str, resid: str, first: bool) -> tuple[str, list[str]]:
    """The pre-norm decoder layers for one new token per row: x + resid is the layer input (B, 1, D).
    first: the <s> step of the encoder subgraph (no past: attention over its one key is its value);
    else MultiHeadAttention over past_{key,value}_self_i (B, H, P, d_k) -> present (B, H, P + 1, d_k).
    Cross keys/values come as past_{key,value}_cross_i (B, H, S, d_k), the mask as mask_i32 (B, S).
    Returns the final-norm output (B, 1, D) and the present names (key, value per layer)."""
    H = model.cfg.n_heads
    presents: list[str] = []
    y = x
    for i, layer in enumerate(model.decoder_layers):
        p = f"d{i}"
        h, resid = g.add_norm(f"{p}.norm_self", y, resid, layer.res_self.norm)
        qkv = g.module_linear(f"{p}.qkv", h, layer.self_attn.qkv_proj)
        q, k, v = f"{p}.q", f"{p}.k", f"{p}.v"
        g.node("Split", [qkv, "split3"], [q, k, v], f"{p}.qkv_split", axis=-1)
        pk, pv = f"present_key_self_{i}", f"present_value_self_{i}"
        if first:
            ctx = v  # softmax over a single key is 1
            _heads(g, pk, k, "heads_shape")
            _heads(g, pv, v, "heads_shape")
        else:
            ins = [q, k, v, "", "", "", f"past_key_self_{i}", f"past_value_self_{i}"]
            ctx = g.node("MultiHeadAttention", ins, [f"{p}.self", pk, pv], f"{p}.self_attn", MS, num_heads=H)
        presents += [pk, pv]
        a = g.module_linear(f"{p}.self_out", ctx, layer.self_attn.out_proj)
        h, resid = g.add_norm(f"{p}.norm_cross", a, resid, layer.res_cross.norm)
        cq = g.module_linear(f"{p}.cross_q", h, layer.cross_attn.q_proj)
        ins = [cq, f"past_key_cross_{i}", f"past_value_cross_{i}", "", "mask_i32"]
        c = g.node("MultiHeadAttention", ins, [f"{p}.cross"], f"{p}.cross_attn", MS, num_heads=H)
        a = g.module_linear(f"{p}.cross_out", c, layer.cross_attn.out_proj)
        h, resid = g.add_norm(f"{p}.norm_ffn", a, resid, layer.res_ffn.norm)
        f = g.node("Relu", [g.module_linear(f"{p}.w1", h, layer.ffn.w1)], [f"{p}.relu"], f"{p}.relu")
        y = g.module_linear(f"{p}.w2", f, layer.ffn.w2)
    h, _ = g.add_norm("final_norm", y, resid, model.decoder_norm)
    return h, presents


def _logits(g: GraphBuilder, model, h: str, step: str, max_len_a: float, max_len_b: int) -> str:
    """h (B, 1, D) -> "logits" (B, 1, V), every logit but </s>'s -inf on the rows at their last
    allowed step: step (1,) int64 >= max_len - 1, max_len = max(1, min(floor(a * src_len + b),
    max_positions - 1)) per row, src_len = sum(mask_i32)."""
    cfg = model.cfg
    out_w = model.generator.weight if model.generator is not None else model.embed.weight  # (V, D)
    raw = g.linear("logits_proj", h, _np(out_w).T, None)
    src_len = g.node(
        "ReduceSum", ["mask_i32", g.init("axis1", np.array([1], np.int64))], ["src_len"], "src_len", keepdims=0
    )
    m = g.node("Cast", [src_len], ["src_len_f"], "src_len_f", to=F)  # (B,)
    m = g.node("Mul", [m, g.init("len_a", np.array(max_len_a, np.float32))], ["ml_a"], "ml_a")
    m = g.node("Add", [m, g.init("len_b", np.array(float(max_len_b), np.float32))], ["ml_ab"], "ml_ab")
    m = g.node("Floor", [m], ["ml_floor"], "ml_floor")
    m = g.node("Min", [m, g.init("len_hi", np.array(cfg.max_positions - 1, np.float32))], ["ml_min"], "ml_min")
    one = g.init("one_f", np.array(1.0, np.float32))
    m = g.node("Max", [m, one], ["max_len"], "max_len")
    last = g.node("Sub", [m, one], ["last_step"], "last_step")
    stepf = g.node("Cast", [step], ["step_f"], "step_f", to=F)
    force = g.node("GreaterOrEqual", [stepf, last], ["force"], "force")  # (B,)
    force = g.node("Unsqueeze", [force, g.init("axes12", np.array([1, 2], np.int64))], ["force3"], "force3")
    eos_only = np.full((1, 1, cfg.vocab_size), -np.inf, np.float32)
    eos_only[..., cfg.eos_id] = 0.0
    forced = g.node("Add", [raw, g.init("eos_only", eos_only)], ["forced_logits"], "forced_logits")
    return g.node("Where", [force, forced, raw], ["logits"], "force_eos")


def _encoder_graph(model, precision: str, max_len_a: float, max_len_b: int) -> onnx.GraphProto:
    """Encoder, cross keys/values, and the first decoder step on decoder_input_ids (<s>)."""
    cfg = model.cfg
    D, H, dk, V = cfg.d_model, cfg.n_heads, cfg.d_k, cfg.vocab_size
    g = GraphBuilder(precision)
    _init_constants(g, model)
    g.node("Identity", ["encoder_attention_mask"], ["mask_i32"], "mask_i32")
    ids = g.node("Cast", ["encoder_input_ids"], ["src_ids"], "src_ids", to=I64)
    x = g.node("Gather", ["embed", ids], ["src_emb"], "src_emb", axis=0)  # (B, S, D)
    S = g.node("Shape", [ids], ["src_len_dim"], "src_len_dim", start=1, end=2)
    zero, axis0 = g.init("zero", np.array([0], np.int64)), g.init("axis0", np.array([0], np.int64))
    pe = g.node("Slice", ["pe", zero, S, axis0], ["src_pe"], "src_pe")  # (S, D)
    y, resid = x, pe
    for i, layer in enumerate(model.encoder_layers):
        p = f"e{i}"
        h, resid = g.add_norm(f"{p}.norm_attn", y, resid, layer.res_attn.norm)
        qkv = g.module_linear(f"{p}.qkv", h, layer.self_attn.qkv_proj)
        q, k, v = f"{p}.q", f"{p}.k", f"{p}.v"
        g.node("Split", [qkv, "split3"], [q, k, v], f"{p}.qkv_split", axis=-1)
        c = g.node("MultiHeadAttention", [q, k, v, "", "mask_i32"], [f"{p}.self"], f"{p}.self_attn", MS, num_heads=H)
        a = g.module_linear(f"{p}.self_out", c, layer.self_attn.out_proj)
        h, resid = g.add_norm(f"{p}.norm_ffn", a, resid, layer.res_ffn.norm)
        f = g.node("Relu", [g.module_linear(f"{p}.w1", h, layer.ffn.w1)], [f"{p}.relu"], f"{p}.relu")
        y = g.module_linear(f"{p}.w2", f, layer.ffn.w2)
    memory, _ = g.add_norm("enc_final_norm", y, resid, model.encoder_norm)
    g.node("Identity", [memory], ["encoder_hidden_states"], "encoder_hidden_states")
    split2 = g.init("split2", np.array([D, D], np.int64))
    cross = []
    for i, layer in enumerate(model.decoder_layers):
        kv = g.module_linear(f"c{i}.kv", memory, layer.cross_attn.kv_proj)
        g.node("Split", [kv, split2], [f"c{i}.k", f"c{i}.v"], f"c{i}.kv_split", axis=-1)
        cross += [_heads(g, f"past_key_cross_{i}", f"c{i}.k", "heads_shape")]
        cross += [_heads(g, f"past_value_cross_{i}", f"c{i}.v", "heads_shape")]
    # the outputs are named present_*_cross_i; inside, the decoder layers read them as past_*_cross_i
    for name in cross:
        g.node("Identity", [name], [name.replace("past_", "present_")], name.replace("past_", "present_"))
    # the first decoder step: <s> at position 0
    dec_ids = g.node("Cast", ["decoder_input_ids"], ["dec_ids"], "dec_ids", to=I64)
    e = g.node("Gather", ["embed", dec_ids], ["dec_emb"], "dec_emb", axis=0)  # (B, 1, D)
    h, presents = _decoder_layers(g, model, e, g.init("pe0", _np(model.pe)[:1]), first=True)
    logits = _logits(g, model, h, zero, max_len_a, max_len_b)
    inputs = [
        helper.make_tensor_value_info("encoder_input_ids", I32, ["batch", "src_len"]),
        helper.make_tensor_value_info("encoder_attention_mask", I32, ["batch", "src_len"]),
        helper.make_tensor_value_info("decoder_input_ids", I32, ["batch", 1]),
    ]
    outputs = [
        helper.make_tensor_value_info(logits, F, ["batch", 1, V]),
        helper.make_tensor_value_info("encoder_hidden_states", F, ["batch", "src_len", D]),  # required, unused
    ]
    outputs += [helper.make_tensor_value_info(n, F, ["batch", H, 1, dk]) for n in presents]
    outputs += [
        helper.make_tensor_value_info(n.replace("past_", "present_"), F, ["batch", H, "src_len", dk]) for n in cross
    ]
    return helper.make_graph(g.nodes, "encoder", inputs, outputs, g.inits)


def _decoder_graph(model, precision: str, max_len_a: float, max_len_b: int) -> onnx.GraphProto:
    """One later step for batch x beams rows; the position is the past's length."""
    cfg = model.cfg
    H, dk, L, V = cfg.n_heads, cfg.d_k, cfg.n_decoder_layers, cfg.vocab_size
    g = GraphBuilder(precision)
    _init_constants(g, model)
    g.node("Identity", ["encoder_attention_mask"], ["mask_i32"], "mask_i32")
    ids = g.node("Cast", ["input_ids"], ["ids"], "ids", to=I64)
    e = g.node("Gather", ["embed", ids], ["emb"], "emb", axis=0)  # (B, 1, D)
    step = g.node("Shape", ["past_key_self_0"], ["step"], "step", start=2, end=3)  # (1,) = P
    pe = g.node("Gather", ["pe", step], ["pe_step"], "pe_step", axis=0)  # (1, D)
    h, presents = _decoder_layers(g, model, e, pe, first=False)
    logits = _logits(g, model, h, step, max_len_a, max_len_b)
    inputs = [
        helper.make_tensor_value_info("input_ids", I32, ["batch", 1]),  # a static 1: one token per step
        helper.make_tensor_value_info("encoder_attention_mask", I32, ["batch", "src_len"]),
    ]
    inputs += [
        helper.make_tensor_value_info(f"past_{kv}_self_{i}", F, ["batch", H, "past_len", dk])
        for i in range(L)
        for kv in ("key", "value")
    ]
    inputs += [
        helper.make_tensor_value_info(f"past_{kv}_cross_{i}", F, ["batch", H, "src_len", dk])
        for i in range(L)
        for kv in ("key", "value")
    ]
    outputs = [helper.make_tensor_value_info(logits, F, ["batch", 1, V])]
    outputs += [helper.make_tensor_value_info(n, F, ["batch", H, "present_len", dk]) for n in presents]
    return helper.make_graph(g.nodes, "decoder", inputs, outputs, g.inits)


def build_beam_search(
    model, path: str | Path, precision: str = "int8", max_len_a: float = MAX_LEN_A, max_len_b: int = MAX_LEN_B
) -> onnx.ModelProto:
    """Write the BeamSearch model of `model` (an export.model.Transformer, pre-norm) to `path` and
    return it. precision: fp32 | int8 (DynamicQuantizeMatMul, int8 weights per output channel).
    max_len_a, max_len_b: the per-sentence length rule built into the subgraphs."""
    if precision not in PRECISIONS:
        raise ValueError(f"unknown precision {precision!r}; choose from {PRECISIONS}")
    cfg = model.cfg
    if not cfg.pre_norm:
        raise ValueError("the BeamSearch subgraphs are written for pre-norm models")
    node = helper.make_node(
        "BeamSearch",
        [
            "input_ids",
            "max_length",
            "min_length",
            "num_beams",
            "num_return_sequences",
            "length_penalty",
            "",  # repetition_penalty
            "",  # vocab_mask
            "",  # prefix_vocab_mask
            "attention_mask",
        ],
        ["sequences", "sequences_scores"],
        name="beam_search",
        domain=MS,
        model_type=1,
        eos_token_id=cfg.eos_id,
        pad_token_id=cfg.pad_id,
        decoder_start_token_id=cfg.bos_id,
        early_stopping=1,
        no_repeat_ngram_size=0,
        vocab_size=cfg.vocab_size,
        encoder=_encoder_graph(model, precision, max_len_a, max_len_b),
        decoder=_decoder_graph(model, precision, max_len_a, max_len_b),
    )
    one = [1]
    inputs = [
        helper.make_tensor_value_info("input_ids", I32, ["batch", "src_len"]),
        helper.make_tensor_value_info("max_length", I32, one),
        helper.make_tensor_value_info("min_length", I32, one),  # optional, but must be fed (0)
        helper.make_tensor_value_info("num_beams", I32, one),
        helper.make_tensor_value_info("num_return_sequences", I32, one),
        helper.make_tensor_value_info("length_penalty", F, one),
        helper.make_tensor_value_info("attention_mask", I32, ["batch", "src_len"]),
    ]
    outputs = [
        helper.make_tensor_value_info("sequences", I32, ["batch", "num_return_sequences", "max_length"]),
        helper.make_tensor_value_info("sequences_scores", F, ["batch", "num_return_sequences"]),
    ]
    graph = helper.make_graph([node], "beam_search", inputs, outputs)
    proto = helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid(MS, 1)],
        producer_name="mtserve.benchmarks.beam_search_op",
    )
    proto.ir_version = 9
    onnx.save(proto, str(path))
    return proto


class BeamSearchOp:
    """A BeamSearch model loaded with ONNX Runtime (CPU): translate_ids(src ids lists, beam) ->
    [(tokens without </s>, score)], in input order, all sentences in one call."""

    def __init__(
        self,
        path: str | Path,
        pad_id: int,
        max_positions: int,
        threads: int = 1,
        max_len_a: float = MAX_LEN_A,
        max_len_b: int = MAX_LEN_B,
    ):
        import onnxruntime as ort

        so = ort.SessionOptions()
        so.intra_op_num_threads = threads
        so.inter_op_num_threads = 1
        so.log_severity_level = 3
        self.session = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
        self.pad_id, self.max_positions = pad_id, max_positions
        self.max_len_a, self.max_len_b = max_len_a, max_len_b

    def translate_ids(
        self, src: Sequence[Sequence[int]], beam: int = 4, length_penalty: float = 1.0
    ) -> list[tuple[list[int], float]]:
        from service.decoding.output_rules import max_output_len

        S = max(map(len, src))
        ids = np.full((len(src), S), self.pad_id, np.int32)
        for i, s in enumerate(src):
            ids[i, : len(s)] = s
        limit = max(max_output_len(len(s), self.max_len_a, self.max_len_b, self.max_positions) for s in src)
        if limit == 1:
            # every sentence ends on the encoder subgraph's step; ORT then runs the decoder once
            # more on uninitialised token ids ("indices element out of data bounds")
            raise ValueError("BeamSearch cannot run a batch in which every sentence may emit </s> only")
        feeds = {
            "input_ids": ids,
            "max_length": np.array([limit + 1], np.int32),  # + the leading <s>
            "min_length": np.array([0], np.int32),
            "num_beams": np.array([beam], np.int32),
            "num_return_sequences": np.array([1], np.int32),
            # greedy: the plain sum of log-probabilities, as the generator scores it
            "length_penalty": np.array([length_penalty if beam > 1 else 0.0], np.float32),
            "attention_mask": (ids != self.pad_id).astype(np.int32),
        }
        seqs, scores = self.session.run(None, feeds)
        out = []
        for row, score in zip(seqs[:, 0], scores[:, 0]):
            toks = row[1:].tolist()  # after <s>: the tokens, then padding (never </s>)
            n = toks.index(self.pad_id) if self.pad_id in toks else len(toks)
            out.append((toks[:n], float(score)))
        return out


# ----------------------------------------------------------------------------- the benchmark


def _interleaved(
    variants: dict[str, Callable[[list[list[int]], int], list[list[int]]]],
    units: list[list[int]],
    src: list[list[int]],
    beam: int,
    rounds: int,
) -> tuple[dict[str, np.ndarray], dict[str, list[list[int]]]]:
    """Seconds per (round, unit) of each variant, the variants' order rotated every unit; and each
    variant's outputs of the first round, in sentence order."""
    names = list(variants)
    times = {n: np.zeros((rounds, len(units))) for n in names}
    outs: dict[str, list[list[int]]] = {n: [[] for _ in src] for n in names}
    for r in range(rounds):
        for u, idx in enumerate(units):
            sents = [src[i] for i in idx]
            rot = (r * len(units) + u) % len(names)
            for n in names[rot:] + names[:rot]:
                t0 = time.perf_counter()
                got = variants[n](sents, beam)
                times[n][r, u] = time.perf_counter() - t0
                if r == 0:
                    for i, toks in zip(idx, got):
                        outs[n][i] = toks
    return times, outs


def _summary(mode: str, times, outs, ref: str, n: int) -> dict[str, dict]:
    res: dict[str, dict[str, object]] = {}
    for name, t in times.items():
        ratio = round(float(np.median(t / times[ref])), 3)
        same = f"{sum(a == b for a, b in zip(outs[name], outs[ref]))}/{n}"
        if mode == "c1":
            res[name] = {"median_ms": round(1e3 * float(np.median(t)), 2), "ratio_vs_portable": ratio}
        else:
            res[name] = {
                "sent_per_s": round(n / float(np.median(t.sum(axis=1))), 1),
                "median_batch_ratio_vs_portable": ratio,
            }
        res[name]["identical_vs_portable"] = same
    return res


def run(args) -> dict:
    import onnxruntime as ort

    from export.checkpoint import load_model
    from export.data import read_parallel
    from service.decoding.generator import generate
    from service.runtime.onnx_model import OnnxSeq2Seq

    model = load_model(args.model, "cpu")
    cfg = model.cfg
    src_text, _ = read_parallel(args.data, args.split)
    src_text = src_text[: args.n]

    def load(precision: str, graph: str) -> OnnxSeq2Seq:
        return OnnxSeq2Seq(args.onnx_dir, precision=precision, graph=graph, intra_op_threads=args.threads)

    fused, portable = load("int8", "fused"), load("int8", "portable")
    src = fused.source_ids(src_text)
    n = len(src)
    bs = args.batch_size
    result: dict = {
        "model": str(args.model),
        "split": args.split,
        "n": n,
        "rounds": args.rounds,
        "threads": args.threads,
        "batch_size": bs,
        "onnxruntime": ort.__version__,
    }
    with tempfile.TemporaryDirectory(prefix="mtserve-beam-search-") as tmp:
        ops = {}
        for precision in PRECISIONS:
            path = Path(tmp) / f"beam_search.{precision}.onnx"
            build_beam_search(model, path, precision)
            ops[precision] = BeamSearchOp(path, cfg.pad_id, cfg.max_positions, args.threads)

        # correctness: the fp32 op against generate() over the fused fp32 graphs
        ref_model = load("fp32", "fused")
        order = sorted(range(n), key=lambda i: len(src[i]))
        batches = [order[s : s + bs] for s in range(0, n, bs)]
        correctness = {}
        for beam in (1, 4):
            want = generate(ref_model, src, beam=beam, batch_size=bs)
            entry: dict[str, object] = {}
            for mode, units in (("c1", [[i] for i in range(n)]), (f"b{bs}", batches)):
                got: list = [None] * n
                for idx in units:
                    for i, h in zip(idx, ops["fp32"].translate_ids([src[i] for i in idx], beam)):
                        got[i] = h
                same = [g[0] == w.tokens for g, w in zip(got, want)]
                entry[mode] = f"{sum(same)}/{n}"
                entry[f"{mode}_max_score_diff"] = float(
                    f"{max((abs(g[1] - w.score) for g, w, s in zip(got, want, same) if s), default=0.0):.2e}"
                )
            correctness["greedy" if beam == 1 else f"beam{beam}"] = entry
        del ref_model
        result["fp32_op_vs_fused_generate"] = correctness

        op = ops["int8"]
        variants = {
            "beam_search_op": lambda s, k: [t for t, _ in op.translate_ids(s, k)],
            "fused+generator": lambda s, k: [h.tokens for h in generate(fused, s, beam=k, batch_size=bs)],
            "portable+generator": lambda s, k: [h.tokens for h in generate(portable, s, beam=k, batch_size=bs)],
        }
        for beam in (1, 4):  # warm-up
            for f in variants.values():
                f(src[:2], beam)
                f(src[2:3], beam)
        for mode, units in (("c1", [[i] for i in range(n)]), (f"b{bs}", batches)):
            result[mode] = {}
            for beam in (1, 4):
                times, outs = _interleaved(variants, units, src, beam, args.rounds)
                key = "greedy" if beam == 1 else f"beam{beam}"
                result[mode][key] = _summary(mode, times, outs, "portable+generator", n)
    return result


def main(argv: list[str] | None = None) -> None:
    from export.data import DEFAULT_DATA_DIR

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=str(REPO / "models" / "de-en" / "1"), help="model dir (weights, config)")
    p.add_argument("--onnx-dir", required=True, help="its export with fused variants (mtserve export --precision all)")
    p.add_argument("--data", default=str(DEFAULT_DATA_DIR))
    p.add_argument("--split", default="test_2016_flickr")
    p.add_argument("--n", type=int, default=200, help="sentences (the first N of the split)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--threads", type=int, default=1, help="intra-op threads of every session")
    p.add_argument("--batch-size", type=int, default=32)
    args = p.parse_args(argv)
    print(json.dumps(run(args)), flush=True)


if __name__ == "__main__":
    main()
