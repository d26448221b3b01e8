"""Convert an mtserve model dir (model.safetensors + config.json + tokenizer.json) to a CTranslate2
Transformer model, so that CTranslate2 runs the very same weights (no torch needed).

    python -m benchmarks.ct2_convert --model models/de-en/1 --out /tmp/de-en-ct2

Mapping (export/model.py -> ctranslate2.specs.TransformerSpec):
- pre-norm, ReLU, final LayerNorm on both stacks (eps 1e-5, torch's default);
- one shared embedding matrix: encoder and decoder embeddings and the output projection
  (CTranslate2 aliases identical variables when it saves, so it is stored once); no output bias;
- embeddings are scaled by sqrt(d_model) (`scale_embeddings`, CTranslate2's default);
- positions: our sinusoidal table is given explicitly (`position_encodings.encodings`), row p for
  position p. Left out, CTranslate2 would build its own table, which lays the sin and cos halves
  out one after the other ([sin | cos]) where ours interleaves them (sin at 2i, cos at 2i+1).
  CTranslate2 indexes the table from 0 for the first source token and for the decoder start
  token, as we do (the fairseq converter has to drop fairseq's padding_idx + 1 offset; we don't);
- fused projections: our self-attention `qkv_proj` is [q; k; v] along the output dim and the
  cross-attention `kv_proj` [k; v], the layouts of CTranslate2's `linear[0]` (self) and
  `linear[1]` (cross), so they are copied as they are; heads are contiguous blocks of d_k in both;
- vocabulary: tokenizer.json's tokens in id order (shared); `<s>` starts decoding, `</s>` ends it,
  and callers append `</s>` to the source themselves (as `source_ids()` does), so neither
  add_source_bos nor add_source_eos is set.

What CTranslate2 cannot express of our search: the per-sentence length rule
(max_len = min(int(a * src_len + b), max_positions - 1) tokens, </s> forced at the last step).
`Ct2Translator` gives CTranslate2 the largest limit of each call and cuts longer outputs
afterwards, which is exact for greedy search.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import numpy as np


def sinusoidal_table(max_positions: int, d_model: int) -> np.ndarray:
    """The table of export.model.sinusoidal_table, in numpy (float32, interleaved sin/cos)."""
    pos = np.arange(max_positions, dtype=np.float32)[:, None]
    div = np.exp(np.arange(0, d_model, 2, dtype=np.float32) * np.float32(-math.log(10000.0) / d_model))
    table = np.zeros((max_positions, d_model), dtype=np.float32)
    table[:, 0::2] = np.sin(pos * div)
    table[:, 1::2] = np.cos(pos * div)
    return table


def vocabulary(tokenizer_json: Path) -> list[str]:
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(tokenizer_json))
    vocab = tok.get_vocab(with_added_tokens=True)
    by_id = {i: t for t, i in vocab.items()}
    if sorted(by_id) != list(range(len(vocab))):
        raise ValueError(f"{tokenizer_json}: token ids are not contiguous")
    return [by_id[i] for i in range(len(vocab))]


def build_spec(model_dir: str | Path):
    """The CTranslate2 TransformerSpec holding the weights of `model_dir`."""
    from ctranslate2.specs import common_spec, transformer_spec
    from safetensors.numpy import load_file

    model_dir = Path(model_dir)
    cfg = json.loads((model_dir / "config.json").read_text())["model"]
    if not cfg.get("pre_norm", True) or not cfg.get("tie_embeddings", True):
        raise NotImplementedError("the benchmark converter handles pre-norm models with tied embeddings only")
    w = load_file(str(model_dir / "model.safetensors"))
    spec = transformer_spec.TransformerSpec.from_config(
        (cfg["n_encoder_layers"], cfg["n_decoder_layers"]),
        cfg["n_heads"],
        pre_norm=True,
        activation=common_spec.Activation.RELU,
    )
    pe = sinusoidal_table(cfg["max_positions"], cfg["d_model"])
    emb = w["embed.weight"]

    def linear(s, name):
        s.weight = w[f"{name}.weight"]
        s.bias = w[f"{name}.bias"]

    def norm(s, name):
        s.gamma = w[f"{name}.weight"]
        s.beta = w[f"{name}.bias"]

    enc = spec.encoder
    enc.embeddings[0].weight = emb
    enc.scale_embeddings = True
    enc.position_encodings.encodings = pe
    norm(enc.layer_norm, "encoder_norm")
    for i, layer in enumerate(enc.layer):
        p = f"encoder_layers.{i}"
        norm(layer.self_attention.layer_norm, f"{p}.res_attn.norm")
        linear(layer.self_attention.linear[0], f"{p}.self_attn.qkv_proj")  # [q; k; v]
        linear(layer.self_attention.linear[1], f"{p}.self_attn.out_proj")
        norm(layer.ffn.layer_norm, f"{p}.res_ffn.norm")
        linear(layer.ffn.linear_0, f"{p}.ffn.w1")
        linear(layer.ffn.linear_1, f"{p}.ffn.w2")

    dec = spec.decoder
    dec.embeddings.weight = emb
    dec.scale_embeddings = True
    dec.position_encodings.encodings = pe
    dec.projection.weight = emb  # tied output projection, no bias
    norm(dec.layer_norm, "decoder_norm")
    for i, layer in enumerate(dec.layer):
        p = f"decoder_layers.{i}"
        norm(layer.self_attention.layer_norm, f"{p}.res_self.norm")
        linear(layer.self_attention.linear[0], f"{p}.self_attn.qkv_proj")  # [q; k; v]
        linear(layer.self_attention.linear[1], f"{p}.self_attn.out_proj")
        norm(layer.attention.layer_norm, f"{p}.res_cross.norm")
        linear(layer.attention.linear[0], f"{p}.cross_attn.q_proj")
        linear(layer.attention.linear[1], f"{p}.cross_attn.kv_proj")  # [k; v]
        linear(layer.attention.linear[2], f"{p}.cross_attn.out_proj")
        norm(layer.ffn.layer_norm, f"{p}.res_ffn.norm")
        linear(layer.ffn.linear_0, f"{p}.ffn.w1")
        linear(layer.ffn.linear_1, f"{p}.ffn.w2")

    tokens = vocabulary(model_dir / "tokenizer.json")
    if len(tokens) != cfg["vocab_size"]:
        raise ValueError(f"tokenizer has {len(tokens)} tokens, the model {cfg['vocab_size']}")
    spec.register_source_vocabulary(tokens)
    spec.register_target_vocabulary(tokens)
    spec.config.unk_token, spec.config.bos_token, spec.config.eos_token = (
        tokens[cfg["unk_id"]],
        tokens[cfg["bos_id"]],
        tokens[cfg["eos_id"]],
    )
    spec.config.decoder_start_token = tokens[cfg["bos_id"]]
    spec.config.add_source_bos = False
    spec.config.add_source_eos = False
    spec.config.layer_norm_epsilon = 1e-5
    return spec


def convert(model_dir: str | Path, out_dir: str | Path, quantization: str | None = None) -> Path:
    """Write the CTranslate2 model to `out_dir` (float32 weights unless `quantization`; int8 is
    also available at load time with compute_type="int8")."""
    spec = build_spec(model_dir)
    spec.validate()
    spec.optimize(quantization=quantization)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    spec.save(str(out))
    return out


class Ct2Translator:
    """CTranslate2 over a converted model, speaking our ids and our length rule."""

    def __init__(
        self,
        ct2_dir: str | Path,
        model_dir: str | Path,
        compute_type: str = "float32",
        inter_threads: int = 1,
        intra_threads: int = 1,
    ):
        import ctranslate2

        self.translator = ctranslate2.Translator(
            str(ct2_dir),
            device="cpu",
            compute_type=compute_type,
            inter_threads=inter_threads,
            intra_threads=intra_threads,
        )
        cfg = json.loads((Path(model_dir) / "config.json").read_text())["model"]
        self.tokens = vocabulary(Path(model_dir) / "tokenizer.json")
        self.index = {t: i for i, t in enumerate(self.tokens)}
        self.max_positions, self.eos_id = cfg["max_positions"], cfg["eos_id"]
        self.compute_type, self.inter_threads, self.intra_threads = compute_type, inter_threads, intra_threads

    def translate_ids(
        self,
        src: list[list[int]],
        beam: int = 4,
        length_penalty: float = 1.0,
        max_len_a: float = 1.5,
        max_len_b: int = 10,
        batch_size: int = 32,
    ) -> list[list[int]]:
        """src: ids each ending with </s> -> emitted ids without </s>, in input order."""
        limits = [max(1, min(int(max_len_a * len(s) + max_len_b), self.max_positions - 1)) for s in src]
        return [ids for ids, _ in self.translate_limited(src, limits, beam, length_penalty, batch_size)]

    def translate_limited(
        self,
        src: list[list[int]],
        limits: list[int],
        beam: int = 4,
        length_penalty: float = 1.0,
        batch_size: int = 32,
        return_scores: bool = False,
        callback=None,
    ) -> list[tuple[list[int], float | None]]:
        """src: ids each ending with </s>; limits: tokens each may emit, </s> included (the
        server's `Sentence.max_len`) -> (emitted ids without </s>, score or None) in input order.
        The score is ours (`service.decoding.generator`): the summed log-probability, </s>
        included, divided by `len ** length_penalty` under beam search (CTranslate2 normalises
        greedy hypotheses too; that is undone). `callback`: translate_batch's, greedy only."""
        results = self.translator.translate_batch(
            [[self.tokens[i] for i in s] for s in src],
            beam_size=beam,
            length_penalty=length_penalty,
            max_decoding_length=max(limits),
            max_batch_size=batch_size,
            batch_type="examples",
            return_scores=return_scores,
            callback=callback,
        )
        out: list[tuple[list[int], float | None]] = []
        for r, limit in zip(results, limits):
            ids = [self.index[t] for t in r.hypotheses[0]][: limit - 1]  # our rule: limit - 1 tokens before </s>
            score = None
            if return_scores:
                # CTranslate2: log p(hypothesis + </s>) / (len + 1) ** length_penalty, whatever the beam.
                score = float(r.scores[0])
                if beam == 1:
                    score *= (len(r.hypotheses[0]) + 1) ** length_penalty
            out.append((ids, score))
        return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="models/de-en/1")
    p.add_argument("--out", required=True)
    p.add_argument("--quantization", default=None, help="e.g. int8 (default: float32 weights)")
    args = p.parse_args()
    print(convert(args.model, args.out, args.quantization))


if __name__ == "__main__":
    main()
