"""The ONNX export: graph contract, dynamic shapes, padding, mixed positions, NaN-freedom and
parity with PyTorch, for the graphs that ship (ORT-optimised) in every precision."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import onnx
import pytest
import torch

from contract.graphs import SEARCH_INPUT, SEARCH_OUTPUTS, decoder_io, encoder_io, fused_decoder_io
from contract.manifest import FORMAT_VERSION, load_manifest, variant_key
from export.graphs import OPSET
from export.to_onnx import ensure_exported, export_model
from service.runtime.onnx_model import OnnxSeq2Seq

PRECISIONS = ["fp32", "int8", "fp16"]


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def random_batch(rng: np.random.Generator, B: int, S: int, vocab: int, lengths=None):
    if lengths is None:
        lengths = rng.integers(1, S + 1, size=B)
        lengths[rng.integers(B)] = S  # the longest row fills the batch
    lengths = np.asarray(lengths)
    mask = (np.arange(S)[None, :] < lengths[:, None]).astype(np.int64)
    ids = rng.integers(4, vocab, size=(B, S)).astype(np.int64) * mask
    return ids, mask


def torch_encode(model, ids, mask):
    with torch.no_grad():
        memory = model.encode(torch.from_numpy(ids), torch.from_numpy(mask))
        cross = model.cross_kv(memory)
    return memory.numpy(), [k.numpy() for k, _ in cross], [v.numpy() for _, v in cross]


def torch_step(model, tokens, positions, past_k, past_v, past_mask, cross_k, cross_v, src_mask):
    t = torch.from_numpy
    with torch.no_grad():
        lp, new, w = model.decode_step(
            t(tokens.reshape(-1, 1)),
            t(positions),
            list(zip(map(t, past_k), map(t, past_v))),
            t(past_mask),
            list(zip(map(t, cross_k), map(t, cross_v))),
            t(src_mask),
            need_weights=True,
        )
    present_k = [np.concatenate([a, k.numpy()], 2) for a, (k, _) in zip(past_k, new)]
    present_v = [np.concatenate([a, v.numpy()], 2) for a, (_, v) in zip(past_v, new)]
    return lp.numpy(), present_k, present_v, w.numpy()


def random_past(rng, B, H, P, dk, L):
    ks = [rng.standard_normal((B, H, P, dk)).astype(np.float32) for _ in range(L)]
    vs = [rng.standard_normal((B, H, P, dk)).astype(np.float32) for _ in range(L)]
    return ks, vs


# ----------------------------------------------------------------------------- the export dir


def test_manifest_lists_every_variant_with_its_contract(tiny_onnx_dir, tiny_model):
    m = load_manifest(tiny_onnx_dir)  # checksums verified
    cfg = tiny_model.cfg
    assert list(m.variants) == ["fp32", "fp32-fused", "int8", "int8-fused", "fp16"]
    assert m.opset == OPSET >= 17
    assert (m.src_lang, m.tgt_lang) == ("de", "en")
    assert m.special_ids.eos_id == cfg.eos_id and m.special_ids.pad_id == cfg.pad_id
    assert (m.dims.vocab_size, m.dims.d_model, m.dims.n_heads, m.dims.d_k) == (
        cfg.vocab_size,
        cfg.d_model,
        cfg.n_heads,
        cfg.d_k,
    )
    assert m.dims.n_decoder_layers == cfg.n_decoder_layers and m.dims.max_positions == cfg.max_positions
    assert (m.generation.max_len_a, m.generation.max_len_b, m.generation.length_penalty, m.generation.beam) == (
        1.5,
        10,
        1.0,
        4,
    )
    assert {"torch", "onnx", "onnxruntime"} <= set(m.tool_versions)
    assert (tiny_onnx_dir / "tokenizer.json").is_file()
    for key, v in m.variants.items():
        p = v.precision
        assert key == variant_key(p, v.graph)
        assert v.encoder.file == (f"encoder.{p}.onnx" if v.graph == "portable" else f"encoder.fused.{p}.onnx")
        assert v.encoder.inputs == encoder_io(cfg)[0] and v.encoder.outputs == encoder_io(cfg)[1]
        if v.graph == "portable":
            assert v.decoder.file == f"decoder.{p}.onnx"
            assert v.decoder.inputs == decoder_io(cfg)[0] and v.decoder.outputs == decoder_io(cfg)[1]
            assert v.optimization.startswith("ORT_ENABLE_EXTENDED") or p == "fp16"
        else:
            assert v.decoder.file == f"decoder.fused.{p}.onnx" and v.target == "cpu"
            assert v.decoder.inputs == fused_decoder_io(cfg)[0] and v.decoder.outputs == fused_decoder_io(cfg)[1]
            # the fused encoder quantises the same activations per call as the portable one; at int8
            # its token table is int8 rows too (the portable graph's is fp32)
            assert v.parity["encoder_vs_portable"] <= (1e-4 if p == "fp32" else 0.5)
            assert v.parity["encoder_memory"] <= (1e-4 if p == "fp32" else 0.5)
            # greedy search's step without log-probabilities: no top_k in, the argmax alone out
            unscored = v.decoder_unscored
            assert unscored.file == f"decoder.fused.{p}.unscored.onnx"
            assert (unscored.inputs, unscored.outputs) == fused_decoder_io(cfg, scored=False)
            assert "top_k" not in [t.name for t in unscored.inputs]
            assert [t.name for t in unscored.outputs][0] == "top_ids" and unscored.output("top_ids").shape == [
                "batch",
                1,
            ]
            assert v.parity["unscored"] == 0.0  # same kernels up to the logits: the same caches and attention
    dec = m.variants["fp32"].decoder
    assert dec.input("past_key_0").shape == ["batch", cfg.n_heads, "past_len", cfg.d_k]
    assert dec.input("cross_key_0").shape == ["sentences", cfg.n_heads, "src_len", cfg.d_k]
    assert dec.input("src_mask").shape == ["sentences", "src_len"]
    assert dec.input("past_mask").dtype == "float32" and dec.input("src_mask").dtype == "int64"
    assert dec.output("cross_attention").shape == ["batch", "src_len"]
    assert m.variants["fp32"].parity["log_probs"] <= 1e-4
    assert set(m.checksums("fp32")) == {"tokenizer.json", "weights.fp32.bin", "encoder.fp32.onnx", "decoder.fp32.onnx"}
    assert set(m.checksums("int8", "fused")) == {
        "tokenizer.json",
        "weights.int8.bin",
        "encoder.fused.int8.onnx",
        "decoder.fused.int8.onnx",
        "decoder.fused.int8.one-row.onnx",
        "decoder.fused.int8.unscored.onnx",
        "decoder.fused.int8.one-row.unscored.onnx",
    }
    assert m.variants["fp32-fused"].parity["log_probs"] <= 1e-4


def test_the_manifest_dims_give_the_contract_the_model_config_gives(tiny_onnx_dir, tiny_model):
    """The serving side derives the graphs' contract from the manifest's dims, without torch."""
    m = load_manifest(tiny_onnx_dir)
    assert encoder_io(m.dims) == encoder_io(tiny_model.cfg)
    assert decoder_io(m.dims) == decoder_io(tiny_model.cfg)
    for v in m.variants.values():
        io = decoder_io(m.dims) if v.graph == "portable" else fused_decoder_io(m.dims)
        assert (v.decoder.inputs, v.decoder.outputs) == io
    dec_in, dec_out = decoder_io(m.dims)
    assert dec_in[-1].name == SEARCH_INPUT and [t.name for t in dec_out[1:4]] == list(SEARCH_OUTPUTS)


def test_the_graph_contract_imports_without_torch():
    code = "import sys, contract.graphs, contract.manifest\nassert 'torch' not in sys.modules\nprint('ok')"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr


@pytest.mark.parametrize("precision", PRECISIONS)
def test_shipped_graphs_pass_the_full_checker_with_dynamic_axes(tiny_onnx_dir, precision):
    for part in ("encoder", "decoder"):
        model = onnx.load(str(tiny_onnx_dir / f"{part}.{precision}.onnx"))
        onnx.checker.check_model(model, full_check=True)
        assert max(o.version for o in model.opset_import if o.domain in ("", "ai.onnx")) >= 17
        for value in list(model.graph.input) + list(model.graph.output):
            dims = [d.dim_param or d.dim_value for d in value.type.tensor_type.shape.dim]
            if value.name == "top_k":
                assert dims == [1]
                continue
            per_sentence = part == "decoder" and (
                value.name == "src_mask" or value.name.startswith(("cross_key", "cross_value"))
            )
            assert dims[0] == ("sentences" if per_sentence else "batch"), (value.name, dims)
            assert value.type.tensor_type.elem_type in (onnx.TensorProto.INT64, onnx.TensorProto.FLOAT)
        names = {v.name: [d.dim_param for d in v.type.tensor_type.shape.dim] for v in model.graph.input}
        if part == "decoder":
            assert names["past_key_0"][2] == "past_len" and names["cross_key_0"][2] == "src_len"


# ----------------------------------------------------------------------------- shapes, padding, positions


@pytest.mark.parametrize("B,S", [(1, 1), (2, 5), (7, 13), (64, 30)])
def test_dynamic_shapes_match_pytorch(tiny_onnx, tiny_model, B, S):
    rng = np.random.default_rng(B * 100 + S)
    cfg = tiny_model.cfg
    ids, mask = random_batch(rng, B, S, cfg.vocab_size)
    memory, ck, cv = tiny_onnx.encode(ids, mask)
    t_memory, t_ck, t_cv = torch_encode(tiny_model, ids, mask)
    assert memory.shape == (B, S, cfg.d_model) and ck[0].shape == (B, cfg.n_heads, S, cfg.d_k)
    assert np.abs(memory - t_memory).max() < 1e-4
    assert max(np.abs(a - b).max() for a, b in zip(ck + cv, t_ck + t_cv)) < 1e-4
    for P in (0, 1, 6):
        tokens = rng.integers(4, cfg.vocab_size, size=(B, 1)).astype(np.int64)
        positions = np.full(B, P, dtype=np.int64)
        pk, pv = random_past(rng, B, cfg.n_heads, P, cfg.d_k, cfg.n_decoder_layers)
        pm = np.ones((B, P), dtype=np.float32)
        out = tiny_onnx.step(tokens, positions, pk, pv, pm, ck, cv, mask, top_k=3, log_probs=True)
        ref = torch_step(tiny_model, tokens, positions, pk, pv, pm, ck, cv, mask)
        assert out.log_probs.shape == (B, cfg.vocab_size)
        assert out.present_k[0].shape == (B, cfg.n_heads, P + 1, cfg.d_k)
        assert out.cross_attention.shape == (B, S)
        assert np.abs(out.log_probs - ref[0]).max() < 1e-4
        assert max(np.abs(a - b).max() for a, b in zip(out.present_k + out.present_v, ref[1] + ref[2])) < 1e-4
        assert np.abs(out.cross_attention - ref[3]).max() < 1e-5
        # the search outputs: each row's 3 best tokens, best first, and log p(</s>)
        assert out.top_ids.shape == out.top_log_probs.shape == (B, 3) and out.top_ids.dtype == np.int64
        np.testing.assert_array_equal(out.top_log_probs, -np.sort(-out.log_probs, axis=1)[:, :3])
        np.testing.assert_array_equal(np.take_along_axis(out.log_probs, out.top_ids, 1), out.top_log_probs)
        np.testing.assert_array_equal(out.top_ids[:, 0], out.log_probs.argmax(1))
        np.testing.assert_array_equal(out.eos_log_prob, out.log_probs[:, cfg.eos_id])


def test_padding_does_not_change_results(tiny_onnx, tiny_model):
    rng = np.random.default_rng(1)
    cfg = tiny_model.cfg
    ids, mask = random_batch(rng, 5, 11, cfg.vocab_size, lengths=[4, 11, 7, 1, 9])
    mem, ck, cv = tiny_onnx.encode(ids, mask)
    tokens = rng.integers(4, cfg.vocab_size, size=(5, 1)).astype(np.int64)
    P = 3
    pk, pv = random_past(rng, 5, cfg.n_heads, P, cfg.d_k, cfg.n_decoder_layers)
    batched = tiny_onnx.step(tokens, np.full(5, P), pk, pv, np.ones((5, P), np.float32), ck, cv, mask, log_probs=True)
    for i, n in enumerate([4, 11, 7, 1, 9]):
        m1, ck1, cv1 = tiny_onnx.encode(ids[i : i + 1, :n], mask[i : i + 1, :n])
        np.testing.assert_allclose(mem[i, :n], m1[0], atol=1e-5)
        alone = tiny_onnx.step(
            tokens[i : i + 1],
            np.array([P]),
            [k[i : i + 1] for k in pk],
            [v[i : i + 1] for v in pv],
            np.ones((1, P), np.float32),
            ck1,
            cv1,
            mask[i : i + 1, :n],
            log_probs=True,
        )
        np.testing.assert_allclose(batched.log_probs[i], alone.log_probs[0], atol=1e-5)
        np.testing.assert_allclose(batched.present_k[0][i], alone.present_k[0][0], atol=1e-5)
        np.testing.assert_allclose(batched.cross_attention[i, :n], alone.cross_attention[0], atol=1e-6)
        assert np.all(batched.cross_attention[i, n:] == 0.0)  # no attention on source padding


def _greedy_trace(model, ids, mask, steps):
    """Decode one source greedily with ORT for `steps` steps; returns the tokens fed and the cache."""
    _, ck, cv = model.encode(ids, mask)
    pk, pv, pm = model.empty_past(1)
    tok, fed = np.array([[model.bos_id]]), []
    for p in range(steps):
        fed.append(int(tok[0, 0]))
        out = model.step(tok, np.array([p]), pk, pv, pm, ck, cv, mask)
        pk, pv = out.present_k, out.present_v
        pm = np.ones((1, p + 1), np.float32)
        tok = out.top_ids[:, :1]
    return fed, tok, pk, pv, ck, cv


def test_rows_at_different_positions_in_one_call_equal_per_row_results(tiny_onnx, tiny_model):
    rng = np.random.default_rng(2)
    cfg, L = tiny_model.cfg, tiny_model.cfg.n_decoder_layers
    steps = [5, 0, 2, 8]  # past lengths of the four rows
    srcs = [random_batch(rng, 1, n, cfg.vocab_size) for n in (6, 3, 9, 4)]
    rows = []
    for (ids, mask), P in zip(srcs, steps):
        _, tok, pk, pv, ck, cv = _greedy_trace(tiny_onnx, ids, mask, P)
        alone = tiny_onnx.step(tok, np.array([P]), pk, pv, np.ones((1, P), np.float32), ck, cv, mask, log_probs=True)
        rows.append((tok, pk, pv, ck, cv, mask, alone))
    B, Pmax, Smax = len(rows), max(steps), max(m.shape[1] for *_, m, _ in rows)
    # Pad the past: rows 0 and 3 on the right, row 2 on the left (padding may sit anywhere).
    past_mask = np.zeros((B, Pmax), np.float32)
    pk = [np.zeros((B, cfg.n_heads, Pmax, cfg.d_k), np.float32) for _ in range(L)]
    pv = [np.zeros_like(k) for k in pk]
    ck = [np.zeros((B, cfg.n_heads, Smax, cfg.d_k), np.float32) for _ in range(L)]
    cv = [np.zeros_like(k) for k in ck]
    src_mask = np.zeros((B, Smax), np.int64)
    for r, ((_tok, k1, v1, ck1, cv1, m1, _), P) in enumerate(zip(rows, steps)):
        off = Pmax - P if r == 2 else 0
        past_mask[r, off : off + P] = 1
        S = m1.shape[1]
        src_mask[r, :S] = m1[0]
        for i in range(L):
            pk[i][r, :, off : off + P], pv[i][r, :, off : off + P] = k1[i][0], v1[i][0]
            ck[i][r, :, :S], cv[i][r, :, :S] = ck1[i][0], cv1[i][0]
    tokens = np.concatenate([r[0] for r in rows])
    out = tiny_onnx.step(tokens, np.array(steps), pk, pv, past_mask, ck, cv, src_mask, log_probs=True)
    ref = torch_step(tiny_model, tokens, np.array(steps), pk, pv, past_mask, ck, cv, src_mask)
    for r, row in enumerate(rows):
        alone = row[-1]
        np.testing.assert_allclose(out.log_probs[r], alone.log_probs[0], atol=1e-5)
        # this step's key is appended after the (padded) past
        np.testing.assert_allclose(out.present_k[-1][r, :, -1], alone.present_k[-1][0, :, -1], atol=1e-5)
        assert int(out.top_ids[r, 0]) == int(alone.top_ids[0, 0])
    assert np.abs(out.log_probs - ref[0]).max() < 1e-4


@pytest.mark.parametrize("precision", PRECISIONS)
def test_beams_share_their_sentence_cross_attention(tiny_onnx_dir, tiny_model, precision):
    """Format 3: n sentences' cross keys/values and src_mask, once each, for n x K rows (the K
    beams of a sentence consecutive) give what the same step gives with them repeated per row, in
    ONNX Runtime and in PyTorch; the cross-attention weights come back per row."""
    model = OnnxSeq2Seq(tiny_onnx_dir, precision=precision, graph="portable")
    cfg, L = tiny_model.cfg, tiny_model.cfg.n_decoder_layers
    rng = np.random.default_rng(11)
    n, K, S, P = 3, 4, 9, 5
    ids, mask = random_batch(rng, n, S, cfg.vocab_size, lengths=[9, 4, 6])
    _, ck, cv = model.encode(ids, mask)
    R = n * K
    pk, pv = random_past(rng, R, cfg.n_heads, P, cfg.d_k, L)
    past_mask = np.ones((R, P), np.float32)
    past_mask[5, :2] = 0
    tokens = rng.integers(4, cfg.vocab_size, size=R)
    positions = np.full(R, P)
    rep = np.repeat(np.arange(n), K)
    folded = model.step(tokens, positions, pk, pv, past_mask, ck, cv, mask, top_k=8, log_probs=True)
    per_row = model.step(
        tokens,
        positions,
        pk,
        pv,
        past_mask,
        [k[rep] for k in ck],
        [v[rep] for v in cv],
        mask[rep],
        top_k=8,
        log_probs=True,
    )
    tol = 1e-5 if precision != "fp16" else 2e-3
    np.testing.assert_allclose(folded.log_probs, per_row.log_probs, atol=tol)
    np.testing.assert_allclose(folded.cross_attention, per_row.cross_attention, atol=tol)
    assert folded.cross_attention.shape == (R, S)
    assert np.abs(folded.cross_attention[rep == 1][:, 4:]).max() < 1e-6  # sentence 1's padding
    if precision == "fp32":
        ref = torch_step(tiny_model, tokens, positions, pk, pv, past_mask, ck, cv, mask)
        np.testing.assert_allclose(folded.log_probs, ref[0], atol=1e-4)
        np.testing.assert_allclose(folded.cross_attention, ref[3], atol=1e-5)


def test_no_nan_even_for_rows_that_are_entirely_padding(tiny_onnx_dir, tiny_model):
    cfg = tiny_model.cfg
    rng = np.random.default_rng(3)
    for precision in PRECISIONS:
        model = OnnxSeq2Seq(tiny_onnx_dir, precision=precision, graph="portable")
        ids, mask = random_batch(rng, 3, 6, cfg.vocab_size, lengths=[6, 2, 0])
        mask[2] = 0  # an entirely padded source row
        ids[2] = cfg.pad_id
        mem, ck, cv = model.encode(ids, mask)
        assert all(np.isfinite(x).all() for x in [mem, *ck, *cv])
        P = 4
        pk, pv = random_past(rng, 3, cfg.n_heads, P, cfg.d_k, cfg.n_decoder_layers)
        pm = np.ones((3, P), np.float32)
        pm[2] = 0  # and an entirely padded past
        out = model.step(
            np.array([[5], [6], [7]]), np.array([4, 4, 4]), pk, pv, pm, ck, cv, mask, top_k=2, log_probs=True
        )
        assert all(
            np.isfinite(x).all()
            for x in [
                out.log_probs,
                out.top_log_probs,
                out.eos_log_prob,
                *out.present_k,
                *out.present_v,
                out.cross_attention,
            ]
        ), precision
        np.testing.assert_allclose(np.exp(out.log_probs).sum(1), 1.0, atol=1e-3)


def test_fp32_log_probs_match_pytorch_over_many_decode_steps(tiny_onnx, tiny_model):
    """Each side keeps its own cache; the tokens are the PyTorch greedy choices (teacher forcing)."""
    cfg = tiny_model.cfg
    worst = 0.0
    for seed, (B, S) in enumerate([(8, 12), (3, 25)]):
        rng = np.random.default_rng(10 + seed)
        ids, mask = random_batch(rng, B, S, cfg.vocab_size)
        _, ck, cv = tiny_onnx.encode(ids, mask)
        _, tck, tcv = torch_encode(tiny_model, ids, mask)
        pk, pv, pm = tiny_onnx.empty_past(B)
        tpk, tpv = [k.copy() for k in pk], [v.copy() for v in pv]
        tokens = np.full((B, 1), cfg.bos_id, dtype=np.int64)
        for p in range(60):
            pos = np.full(B, p, dtype=np.int64)
            out = tiny_onnx.step(tokens, pos, pk, pv, pm, ck, cv, mask, log_probs=True)
            tlp, tpk, tpv, _ = torch_step(tiny_model, tokens, pos, tpk, tpv, pm, tck, tcv, mask)
            worst = max(worst, float(np.abs(out.log_probs - tlp).max()))
            pk, pv = out.present_k, out.present_v
            pm = np.ones((B, p + 1), np.float32)
            tokens = tlp.argmax(1)[:, None].astype(np.int64)
    assert worst <= 1e-4, worst


@pytest.mark.parametrize("precision,bound", [("int8", 1.0), ("fp16", 0.1)])
def test_int8_and_fp16_load_and_run(tiny_onnx_dir, tiny_onnx, precision, bound):
    model = OnnxSeq2Seq(tiny_onnx_dir, precision=precision, graph="portable")
    assert model.precision == precision and model.provider == "cpu"
    rng = np.random.default_rng(4)
    ids, mask = random_batch(rng, 4, 9, model.vocab_size)
    got, ref = model.encode(ids, mask), tiny_onnx.encode(ids, mask)
    assert got[0].dtype == np.float32 and got[0].shape == ref[0].shape
    pk, pv, pm = model.empty_past(4)
    out = model.step(
        np.full((4, 1), model.bos_id), np.zeros(4, np.int64), pk, pv, pm, got[1], got[2], mask, log_probs=True
    )
    ref_out = tiny_onnx.step(
        np.full((4, 1), model.bos_id), np.zeros(4, np.int64), pk, pv, pm, ref[1], ref[2], mask, log_probs=True
    )
    assert out.log_probs.dtype == np.float32 and np.isfinite(out.log_probs).all()
    assert out.top_log_probs.dtype == np.float32 and out.present_k[0].dtype == np.float32
    assert np.abs(out.log_probs - ref_out.log_probs).max() < bound
    assert model.manifest.variant(precision).parity["log_probs"] < bound


def test_cuda_request_falls_back_to_cpu_or_raises_when_strict(tiny_onnx_dir, caplog):
    import onnxruntime as ort

    if "CUDAExecutionProvider" in ort.get_available_providers():
        pytest.skip("CUDA is available here")
    with caplog.at_level("WARNING", logger="mtserve.onnx"):
        model = OnnxSeq2Seq(tiny_onnx_dir, provider="cuda")
    assert model.provider == "cpu" and "falling back" in caplog.text
    with pytest.raises(RuntimeError, match="CUDA"):
        OnnxSeq2Seq(tiny_onnx_dir, provider="cuda", strict=True)


def test_cli_export_with_the_torchscript_fallback_keeps_variants_side_by_side(tiny_model_dir, tmp_path, capsys):
    from mtserve.cli import main

    out = tmp_path / "onnx"
    main(["export", "--model", str(tiny_model_dir), "--out", str(out), "--exporter", "torchscript"])
    assert "fp32" in capsys.readouterr().out
    main(
        [
            "export",
            "--model",
            str(tiny_model_dir),
            "--out",
            str(out),
            "--exporter",
            "torchscript",
            "--precision",
            "int8",
            "--name",
            "tiny",
            "--version",
            "7",
        ]
    )
    m = load_manifest(out)
    assert sorted(m.variants) == ["fp32", "fp32-fused", "int8", "int8-fused"] and (m.name, m.version) == ("tiny", "7")
    assert m.variants["fp32"].exporter == "torch.onnx.export(dynamo=False)"
    assert m.variants["fp32"].parity["log_probs"] <= 1e-4
    assert sorted(p.name for p in out.glob("*.onnx")) == [
        "decoder.fp32.onnx",
        "decoder.fused.fp32.onnx",
        "decoder.fused.fp32.unscored.onnx",
        "decoder.fused.int8.one-row.onnx",
        "decoder.fused.int8.one-row.unscored.onnx",
        "decoder.fused.int8.onnx",
        "decoder.fused.int8.unscored.onnx",
        "decoder.int8.onnx",
        "encoder.fp32.onnx",
        "encoder.fused.fp32.onnx",
        "encoder.fused.int8.onnx",
        "encoder.int8.onnx",
    ]
    assert json.loads((out / "manifest.json").read_text())["format_version"] == FORMAT_VERSION == 5


def test_an_export_of_an_older_format_is_redone(tiny_model_dir, tmp_path):
    """Graphs of an older contract (format 1: no top_k, new_key outputs) would fail every request:
    `ensure_exported`, as `mtserve verify` runs it, exports again instead of reusing them (`mtserve
    serve` refuses them, and `make serve` exports again)."""
    out = tmp_path / "onnx"
    export_model(tiny_model_dir, out, ["fp32"])
    manifest = json.loads((out / "manifest.json").read_text())
    manifest["format_version"] = 1
    (out / "manifest.json").write_text(json.dumps(manifest))
    before = (out / "decoder.fp32.onnx").stat().st_mtime_ns
    assert ensure_exported(tiny_model_dir, "fp32", out) == out
    assert load_manifest(out).format_version == FORMAT_VERSION
    assert (out / "decoder.fp32.onnx").stat().st_mtime_ns != before


def test_export_refuses_an_unknown_precision(tiny_model_dir, tmp_path):
    with pytest.raises(ValueError, match="precision"):
        export_model(tiny_model_dir, tmp_path, ["int4"])


def test_verify_prints_one_json_line_with_parity_numbers(tiny_model_dir, tiny_onnx_dir, data_dir, capsys):
    from mtserve.verify import main

    main(
        [
            "--model",
            str(tiny_model_dir),
            "--data",
            str(data_dir),
            "--limit",
            "30",
            "--steps",
            "12",
            "--batches",
            "2",
            "--threads",
            "1",
            "--beam",
            "2",
        ]
    )
    lines = capsys.readouterr().out.strip().splitlines()
    result = json.loads(lines[-1])
    assert result["onnx_dir"] == str(tiny_onnx_dir)  # reused, not re-exported
    assert result["max_abs_log_prob_diff"] <= 1e-4
    assert result["greedy"]["sentences"] == 30 and result["greedy"]["identical"] == 30
    assert result["greedy"]["identical_without_scores"] == 30  # the unscored greedy step
    assert result["beam2"]["identical"] == 30 and "identical_without_scores" not in result["beam2"]


def test_a_version_dir_of_a_repository_exports_under_its_model_name(tiny_model_dir, tmp_path):
    """In Triton's layout, NAME/VERSION/, the manifest is named after NAME, not the version."""
    version = tmp_path / "xx-yy" / "3"
    version.mkdir(parents=True)
    for f in tiny_model_dir.iterdir():
        if f.is_file():
            (version / f.name).symlink_to(f)
    manifest = export_model(version, tmp_path / "out", ["fp32"], check=False)
    assert manifest.name == "xx-yy"
    assert export_model(tiny_model_dir, tmp_path / "plain", ["fp32"], check=False).name == tiny_model_dir.name


@pytest.mark.parametrize("V", [96, 500, 8000])
def test_the_two_pass_ranking_equals_one_pass_ties_included(V):
    """`block_top_k` and `block_argmax` (the fused step's ranking) against numpy's stable order, on
    rows full of ties (small integers), for every k up to more than the number of blocks."""
    import onnxruntime as ort
    from onnx import TensorProto, helper

    from export.fused.builder import GraphBuilder
    from export.fused.ranking import block_argmax, block_top_k, rank_block

    block = rank_block(V)
    assert block and V % block == 0 and 16 <= block <= 64
    rng = np.random.default_rng(V)
    x = rng.integers(-3, 4, (6, V)).astype(np.float32)
    x[0] = 1.0  # one row all ties
    graphs = {}
    for name in ("top_k", "argmax"):
        b = GraphBuilder("fp32")
        if name == "top_k":
            block_top_k(b, "x", "k", V, block, "values", "ids")
            ins = [
                helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, V]),
                helper.make_tensor_value_info("k", TensorProto.INT64, [1]),
            ]
            outs = [
                helper.make_tensor_value_info("values", TensorProto.FLOAT, [None, None]),
                helper.make_tensor_value_info("ids", TensorProto.INT64, [None, None]),
            ]
        else:
            block_argmax(b, "x", V, block, "best")
            ins = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, V])]
            outs = [helper.make_tensor_value_info("best", TensorProto.INT64, [None, 1])]
        model = helper.make_model(
            helper.make_graph(b.nodes, name, ins, outs, b.inits), opset_imports=[helper.make_opsetid("", 18)]
        )
        model.ir_version = 9
        onnx.checker.check_model(model, full_check=True)
        graphs[name] = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    order = np.argsort(-x, axis=1, kind="stable")  # the lower id first among equals
    (best,) = graphs["argmax"].run(None, {"x": x})
    np.testing.assert_array_equal(best[:, 0], order[:, 0])
    for k in sorted({1, 2, 3, V // block, V // block + 2, 2 * (V // block) + 1}):
        values, ids = graphs["top_k"].run(None, {"x": x, "k": np.array([k], np.int64)})
        np.testing.assert_array_equal(ids, order[:, :k], err_msg=f"k={k}")
        np.testing.assert_array_equal(values, np.take_along_axis(x, order[:, :k], axis=1))


@pytest.mark.parametrize("V,eos", [(96, 0), (96, 50), (8000, 2), (8000, 7999), (1009, 0), (1009, 1008)])
def test_the_unscored_argmax_bans_eos_where_eos_bias_says(V, eos):
    """The unscored step's ranking (`_step_ranking` with scored=False): the logits, padded to
    blocks where no block divides the vocabulary (1009 is prime), then `block_argmax` with
    eos_bias added to </s>'s logit. </s> is the best token of every row but the first; the rows
    with -inf take the next best, the lower id on ties, and a padding column never wins."""
    import onnxruntime as ort
    from onnx import TensorProto, helper

    from export.fused.builder import GraphBuilder
    from export.fused.ranking import ARGMAX_BLOCK, block_argmax, padded_output, rank_block

    rng = np.random.default_rng(V + eos)
    D = 8
    table = rng.integers(-2, 3, (V, D)).astype(np.float32)
    bias = rng.integers(-3, 1, V).astype(np.float32)  # logits of small integers: ties everywhere
    bias[eos] = 100.0
    block = rank_block(V) or ARGMAX_BLOCK
    padded, padded_bias = padded_output(table, bias, block)
    assert len(padded) % block == 0 and len(padded) - V == (0 if rank_block(V) else -V % ARGMAX_BLOCK)
    b = GraphBuilder("fp32")
    logits = b.linear("logits", "h", padded.T, padded_bias)
    block_argmax(b, logits, len(padded), block, "best", eos=("eos_bias", eos))
    ins = [
        helper.make_tensor_value_info("h", TensorProto.FLOAT, [None, D]),
        helper.make_tensor_value_info("eos_bias", TensorProto.FLOAT, [None, 1]),
    ]
    outs = [helper.make_tensor_value_info("best", TensorProto.INT64, [None, 1])]
    model = helper.make_model(
        helper.make_graph(b.nodes, "argmax", ins, outs, b.inits), opset_imports=[helper.make_opsetid("", 18)]
    )
    model.ir_version = 9
    onnx.checker.check_model(model, full_check=True)
    graph = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    h = rng.integers(-1, 2, (7, D)).astype(np.float32)
    h[0] = 0.0  # a row of the bias alone
    eos_bias = np.array([[0.0], [-np.inf], [0.0], [-np.inf], [-np.inf], [0.0], [-np.inf]], np.float32)
    want = h @ table.T + bias
    assert (want.argmax(axis=1) == eos).all()
    want[:, eos] += eos_bias[:, 0]
    (best,) = graph.run(None, {"h": h, "eos_bias": eos_bias})
    np.testing.assert_array_equal(best[:, 0], want.argmax(axis=1))
    assert (best[eos_bias[:, 0] == 0, 0] == eos).all() and (best[eos_bias[:, 0] < 0, 0] != eos).all()
