"""The fused graphs (export/fused/) of the architectures `ModelConfig` describes beside mtserve's
own (those of imported Marian and M2M100/NLLB models): post-norm, the gelu and swish activations,
unscaled embeddings, a stored position table, a logits bias, a source vocabulary of its own, an
untied output projection, another decoder start token. Small random models, exported in fp32 and
int8 by `export_model` (portable and fused graphs, its own parity checks included), then decoded
greedily with the fused graphs against PyTorch."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch

from contract.manifest import Manifest, Variant
from export.checkpoint import save_model_dir
from export.checks import FP32_TOLERANCE
from export.model import NEG_INF, ModelConfig, Transformer
from export.to_onnx import export_model

pytestmark = pytest.mark.usefixtures("one_torch_thread")

TOKENIZER = Path(__file__).resolve().parents[2] / "models" / "de-en" / "1" / "tokenizer.json"
SMALL = dict(
    vocab_size=96, d_model=32, n_heads=4, n_encoder_layers=2, n_decoder_layers=2, d_ff=64, dropout=0.0, max_positions=32
)
ARCHITECTURES = {
    # Marian: post-norm, swish, unscaled embeddings, a stored position table, a logits bias, a
    # source vocabulary of its own, decoding from <pad>
    "marian": dict(
        pre_norm=False,
        activation="swish",
        scale_embedding=False,
        positions="table",
        logits_bias=True,
        src_vocab_size=70,
        decoder_start_id=0,
        layer_norm_eps=1e-6,
    ),
    "post_norm_gelu": dict(pre_norm=False, activation="gelu"),
    # M2M100/NLLB: pre-norm, relu, decoding from </s>; here with an untied output projection too
    "pre_norm_relu": dict(activation="relu", decoder_start_id=2, tie_embeddings=False),
}
# The bound on int8's |Δ log_probs| against PyTorch that the other int8 tests use (test_to_onnx.py).
INT8_BOUND = 1.0
STEPS = 6
ACTIVATION_OPS = {"relu": "Relu", "gelu": "Gelu", "swish": "QuickGelu"}


def random_model(cfg: ModelConfig) -> Transformer:
    """A model of `cfg` with every stored tensor random: the norms' gains and biases, the position
    table and the logits bias (with "never <pad>" folded in, as the importer does)."""
    torch.manual_seed(0)
    model = Transformer(cfg).eval()
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, torch.nn.LayerNorm):
                module.weight.uniform_(0.5, 1.5)
                module.bias.normal_(0.0, 0.1)
        if cfg.positions == "table":
            model.pe.normal_(0.0, 0.5)
        if cfg.logits_bias:
            model.final_logits_bias.normal_(0.0, 1.0)
            model.final_logits_bias[cfg.pad_id] = NEG_INF
    return model


@pytest.fixture(scope="module", params=list(ARCHITECTURES))
def exported(request, tmp_path_factory) -> tuple[Transformer, Path, Manifest]:
    model = random_model(ModelConfig(**SMALL, **ARCHITECTURES[request.param]))
    root = tmp_path_factory.mktemp(request.param)
    save_model_dir(model, root / "model", TOKENIZER)
    manifest = export_model(root / "model", root / "onnx", ["fp32", "int8"])
    return model, root / "onnx", manifest


def test_every_fused_graph_is_exported_within_its_parity_bound(exported):
    _, _, manifest = exported
    assert list(manifest.variants) == ["fp32", "fp32-fused", "int8", "int8-fused"]
    fp32, int8 = manifest.variants["fp32-fused"], manifest.variants["int8-fused"]
    assert fp32.decoder_unscored is not None and fp32.decoder_one_row is None
    assert int8.decoder_unscored is not None and int8.decoder_one_row is not None
    assert int8.decoder_one_row_unscored is not None
    for key in ("log_probs", "present_kv", "encoder_memory", "cross_kv", "unscored"):
        assert fp32.parity[key] <= FP32_TOLERANCE, key
    for key in ("log_probs", "one_row_log_probs", "encoder_memory"):
        assert int8.parity[key] < INT8_BOUND, key
    assert int8.parity["unscored"] == int8.parity["one_row_unscored"] == 0.0


def test_the_fused_graphs_have_the_architecture_of_the_model(exported):
    model, out, manifest = exported
    cfg = model.cfg
    variant = manifest.variants["int8-fused"]
    encoder, decoder = onnx.load(str(out / variant.encoder.file)), onnx.load(str(out / variant.decoder.file))
    for graph, layers, sublayers in ((encoder, cfg.n_encoder_layers, 2), (decoder, cfg.n_decoder_layers, 3)):
        norms = [n for n in graph.graph.node if n.op_type == "LayerNormalization"]
        # post-norm: one norm after each sublayer; pre-norm: one before each, and the stack's final one
        assert len(norms) == layers * sublayers + cfg.pre_norm
        for n in norms:
            assert onnx.helper.get_attribute_value(n.attribute[-1]) == pytest.approx(cfg.layer_norm_eps)
        ops = {n.op_type for n in graph.graph.node}
        assert (
            ACTIVATION_OPS[cfg.activation] in ops
            and not (set(ACTIVATION_OPS.values()) - {ACTIVATION_OPS[cfg.activation]}) & ops
        )
    # int8: the token tables are int8 rows with a scale each; fp32 keeps the float table
    V = cfg.src_vocab_size or cfg.vocab_size
    inits = {t.name: t for t in encoder.graph.initializer}
    assert "embed" not in inits
    assert (tuple(inits["embed.q"].dims), inits["embed.q"].data_type) == ((V, cfg.d_model), onnx.TensorProto.INT8)
    assert tuple(inits["embed.s"].dims) == (V, 1)
    assert [tuple(t.dims) for t in decoder.graph.initializer if t.name == "embed.q"] == [(cfg.vocab_size, cfg.d_model)]
    fp32 = onnx.load(str(out / manifest.variants["fp32-fused"].encoder.file))
    assert {t.name: tuple(t.dims) for t in fp32.graph.initializer}["embed"] == (V, cfg.d_model)
    assert ("logits.b" in {t.name for t in decoder.graph.initializer}) == cfg.logits_bias


def _session(path: Path) -> ort.InferenceSession:
    so = ort.SessionOptions()
    so.log_severity_level = 3
    return ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])


def _sources(cfg: ModelConfig, rows: int) -> tuple[torch.Tensor, torch.Tensor]:
    """`rows` sources (the second one padded) from the encoder's vocabulary."""
    lengths = torch.tensor([9, 4][:rows])
    mask = (torch.arange(9)[None, :] < lengths[:, None]).long()
    ids = torch.randint(4, cfg.src_vocab_size or cfg.vocab_size, (rows, 9), generator=torch.Generator().manual_seed(1))
    return ids * mask, mask


def _step_feed(
    cfg: ModelConfig,
    tokens: np.ndarray,
    P: int,
    caches: list[np.ndarray],
    cross: list[np.ndarray],
    src_mask: np.ndarray,
) -> dict[str, np.ndarray]:
    B = len(tokens)
    feed = {
        "tokens": tokens,
        "positions": np.full((B, 1), P, np.int64),
        "past_sequence_length": np.array([P], np.int32),
        "self_mask": np.ones((B, STEPS), np.int32),
        "src_mask": src_mask.astype(np.int32),
        "top_k": np.array([4], np.int64),
        "beam_width": np.array([1], np.int32),
        "cache_indirection": np.zeros((B, 1, STEPS), np.int32),
    }
    for i in range(cfg.n_decoder_layers):
        feed[f"cache_key_{i}"], feed[f"cache_value_{i}"] = caches[2 * i], caches[2 * i + 1]
        feed[f"cross_key_{i}"], feed[f"cross_value_{i}"] = cross[2 * i], cross[2 * i + 1]
    return feed


def _greedy_against_pytorch(model: Transformer, out: Path, variant: Variant, one_row: bool) -> dict[str, float]:
    """Greedy decoding for STEPS steps with the fused encoder and decoder step of `variant` (its
    one-row step with `one_row`, over one source; else two), each step fed PyTorch's own choice from
    the start token on, the unscored twin of the step run on the same state. Returns the max |Δ| of
    the log-probabilities and cross-attention against `Transformer.decode_step`; asserts that the
    unscored step's tokens are the argmax of the scored step's log-probabilities (without </s>
    where its eos_bias bans it), and both PyTorch's
    wherever PyTorch's margin exceeds twice that row's |Δ|."""
    cfg = model.cfg
    rows = 1 if one_row else 2
    src_ids, src_mask = _sources(cfg, rows)
    feed = {"src_ids": src_ids.numpy(), "src_mask": src_mask.numpy()}
    cross = _session(out / variant.encoder.file).run(None, feed)[1:]
    specs = (
        (variant.decoder_one_row, variant.decoder_one_row_unscored)
        if one_row
        else (variant.decoder, variant.decoder_unscored)
    )
    assert specs[0] is not None and specs[1] is not None
    scored, unscored = _session(out / specs[0].file), _session(out / specs[1].file)
    names = [o.name for o in scored.get_outputs()]
    caches = [np.zeros((rows, cfg.n_heads, STEPS, cfg.d_k), np.float32) for _ in range(2 * cfg.n_decoder_layers)]
    with torch.no_grad():
        ref_cross = model.cross_kv(model.encode(src_ids, src_mask))
    past = [(k[:, :, :0], v[:, :, :0]) for k, v in ref_cross]
    tokens = torch.full((rows, 1), cfg.start_id, dtype=torch.long)
    diffs = {"log_probs": 0.0, "cross_attention": 0.0}
    checked = 0
    for P in range(STEPS):
        step = _step_feed(cfg, tokens.numpy(), P, caches, cross, src_mask.numpy())
        got = dict(zip(names, scored.run(None, step)))
        for ban in (0.0, -np.inf):  # eos_bias: none, then every row's </s> banned
            bias = np.full((rows, 1), ban, np.float32)
            greedy = unscored.run(["top_ids"], {k: v for k, v in step.items() if k != "top_k"} | {"eos_bias": bias})
            want = got["log_probs"].copy()
            want[:, cfg.eos_id] += ban
            assert np.array_equal(greedy[0][:, 0], want.argmax(axis=1)), f"step {P}, eos_bias {ban}"
        with torch.no_grad():
            lp, new_kv, w = model.decode_step(
                tokens, torch.full((rows,), P), past, torch.ones(rows, P), ref_cross, src_mask, need_weights=True
            )
        ref = lp.numpy()
        row_delta = np.abs(got["log_probs"] - ref).max(axis=1)
        diffs["log_probs"] = max(diffs["log_probs"], float(row_delta.max()))
        diffs["cross_attention"] = max(
            diffs["cross_attention"], float(np.abs(got["cross_attention"] - w.numpy()).max())
        )
        top2 = -np.sort(-ref, axis=1)[:, :2]
        sure = top2[:, 0] - top2[:, 1] > 2 * row_delta
        assert np.array_equal(got["top_ids"][sure, 0], ref.argmax(axis=1)[sure]), f"step {P}"
        checked += int(sure.sum())
        for i in range(2 * cfg.n_decoder_layers):  # the step wrote slot P of a cache it was not bound to
            caches[i][:, :, P] = got[f"present_{('key', 'value')[i % 2]}_{i // 2}"][:, :, P]
        past = [(torch.cat([pk, k], 2), torch.cat([pv, v], 2)) for (pk, pv), (k, v) in zip(past, new_kv)]
        tokens = lp.argmax(dim=1, keepdim=True)
    assert checked > 0, "PyTorch's margins left no step to compare the best tokens at"
    return diffs


@pytest.mark.parametrize("precision,one_row", [("fp32", False), ("int8", False), ("int8", True)])
def test_greedy_decoding_with_the_fused_graphs_follows_pytorch(exported, precision, one_row):
    model, out, manifest = exported
    diffs = _greedy_against_pytorch(model, out, manifest.variants[f"{precision}-fused"], one_row)
    assert diffs["log_probs"] <= (FP32_TOLERANCE if precision == "fp32" else INT8_BOUND)
    assert diffs["cross_attention"] <= (1e-5 if precision == "fp32" else 0.1)
