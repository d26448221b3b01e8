"""The serving path's beam search (beam 4) and greedy search over an imported Marian's ONNX fp32
graphs against CTranslate2's conversion of the same Hugging Face folder (`TransformersConverter`,
as `ct2-transformers-converter`), on the 1,000 test_2016_flickr sentences: token ids identical, and
each hypothesis's score equal to CTranslate2's `score_batch` of the same tokens.

The folder is the OPUS-MT layout (one shared vocabulary, <pad> last: CTranslate2's Marian loader
drops that last row, so it cannot convert separate vocabularies or another <pad> id), trained for
TRAIN_STEPS updates so that its outputs end with </s> at lengths that depend on the source (the
random tiny models repeat one token up to the length cap).

Semantics shared by both sides:
- decoding starts from <pad>. transformers (and mtserve, which follows it) embeds the <pad> row;
  CTranslate2 (`start_from_zero_embedding`, Marian's own rule) a zero vector. The two agree when
  the <pad> row is zero, as in every OPUS-MT checkpoint transformers converted (the row it adds is
  zeros); training updates it through the tied output projection, so the training here zeroes it
  after each update. With it left non-zero the two differ from the first step on.
- <pad> is never generated (mtserve: bad_words_ids folded into the logits bias; CTranslate2: the
  row removed), at most MAX_LEN tokens are emitted, </s> included.
- beam search: the 2 * beam best candidates of a sentence, those ending with </s> among the first
  `beam` finish, the best `beam` others go on; a sentence stops once `beam` hypotheses have
  finished (CTranslate2: beam_size * patience, patience 1; it exits as soon as the best candidate
  ends only when length_penalty and coverage_penalty are both 0, so the comparison uses
  length_penalty 1); ranked by sum(log p) / len with `len` counting </s> (CTranslate2 counts it
  with or without return_end_token). Greedy: both scores are plain sums (CTranslate2's with
  length_penalty 0).
One difference: at the cap mtserve (like fairseq and transformers' forced_eos_token_id) forces </s>,
CTranslate2 stops without it; sentences that reach the cap on either side are counted and left
out of the comparison.

CTranslate2's own beam and greedy scores differ from its `score_batch` of the very same tokens by
up to about 6e-4 a token (its incremental decoding's arithmetic); mtserve's equal `score_batch`
to 1e-4 over the whole hypothesis, so that is what the scores are held to."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest
import torch

from service.decoding.generator import generate
from service.runtime.onnx_model import OnnxSeq2Seq

ctranslate2 = pytest.importorskip("ctranslate2")

MAX_LEN = 40  # tokens each side may emit, </s> included
MIN_COMPARED = 200  # sentences that end before the cap on both sides, at least
TRAIN_STEPS = 120
LEARNING_RATE = 3e-3
SCORE_BOUND = 1e-4  # |Δ sum(log p)| against CTranslate2's score_batch of the same tokens
SEARCH_SCORE_BOUND = 2e-3  # |Δ| against the score CTranslate2's search reports, a token

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def train_briefly(folder: Path, out: Path, data_dir: Path) -> Path:
    """`folder`'s Marian after TRAIN_STEPS Adam updates on batches of 32 training pairs, its
    <pad> row (the decoder's start embedding) kept at zero as in OPUS-MT's checkpoints."""
    import torch.nn.functional as F
    from transformers import MarianMTModel, MarianTokenizer

    torch.manual_seed(0)
    tok = MarianTokenizer.from_pretrained(str(folder))
    model = MarianMTModel.from_pretrained(str(folder))
    pad = model.config.pad_token_id
    de, en = ([line.strip() for line in gzip.open(data_dir / f"train.{lang}.gz", "rt")][:4000] for lang in ("de", "en"))
    optim = torch.optim.Adam(model.parameters(), lr=LEARNING_RATE)
    model.train()
    for step in range(TRAIN_STEPS):
        i = step * 32 % len(de)
        batch = tok(de[i : i + 32], text_target=en[i : i + 32], padding=True, return_tensors="pt")
        labels = batch["labels"]
        decoder_input_ids = torch.cat([torch.full((len(labels), 1), pad), labels[:, :-1]], dim=1)
        logits = model(
            input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], decoder_input_ids=decoder_input_ids
        ).logits
        loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)), labels.reshape(-1), ignore_index=pad)
        optim.zero_grad()
        loss.backward()
        optim.step()
        with torch.no_grad():
            model.get_input_embeddings().weight[pad].zero_()
    model.eval()
    model.save_pretrained(str(out))
    tok.save_pretrained(str(out))
    (out / "generation_config.json").write_text((folder / "generation_config.json").read_text())
    return out


@pytest.fixture(scope="module")
def marian_pair(tmp_path_factory, hf_marian_dir, data_dir) -> tuple[Path, Path]:
    """The trained Marian imported with `mtserve import`'s machinery, and converted by CTranslate2."""
    from ctranslate2.converters import TransformersConverter

    from export.hf.importer import import_model

    root = tmp_path_factory.mktemp("ct2-parity")
    folder = train_briefly(hf_marian_dir, root / "opus-mt-trained", data_dir)
    import_model(folder, root / "repository", "marian", version=1, precisions=("fp32",))
    TransformersConverter(str(folder)).convert(str(root / "ct2"))
    return root / "repository" / "marian" / "1", root / "ct2"


@pytest.mark.parametrize("beam", [4, 1])
def test_search_matches_ctranslate2(marian_pair, data_dir, beam, record_property):
    model_dir, ct2_dir = marian_pair
    model = OnnxSeq2Seq(model_dir, precision="fp32", graph="fused")
    with gzip.open(data_dir / "test_2016_flickr.de.gz", "rt", encoding="utf-8") as f:
        texts = [line.strip() for line in f]
    src = model.source_ids(texts)
    ours = generate(model, src, beam=beam, length_penalty=1.0, max_len_a=0.0, max_len_b=MAX_LEN)

    vocab = json.loads((ct2_dir / "shared_vocabulary.json").read_text(encoding="utf-8"))
    ids = {token: i for i, token in enumerate(vocab)}
    translator = ctranslate2.Translator(str(ct2_dir), device="cpu", intra_threads=1, inter_threads=1)
    source_tokens = [[vocab[i] for i in s] for s in src]
    results = translator.translate_batch(
        source_tokens,
        beam_size=beam,
        length_penalty=1.0 if beam > 1 else 0.0,
        max_decoding_length=MAX_LEN,
        return_scores=True,
        return_end_token=True,
    )
    theirs = [[ids[t] for t in r.hypotheses[0]] for r in results]

    capped = {i for i, (h, t) in enumerate(zip(ours, theirs)) if len(h.tokens) + 1 >= MAX_LEN or len(t) >= MAX_LEN}
    compared = [i for i in range(len(src)) if i not in capped]
    differ = [i for i in compared if ours[i].tokens + [model.eos_id] != theirs[i]]
    assert not differ, f"{len(differ)}/{len(compared)} differ, first {differ[:5]}"
    assert len(compared) >= MIN_COMPARED, f"{len(capped)} sentences reach the cap: the model does not end them"
    assert len({tuple(ours[i].tokens) for i in compared}) >= 20  # outputs depend on the source

    scored = translator.score_batch(
        [source_tokens[i] for i in compared], [[vocab[t] for t in ours[i].tokens] for i in compared]
    )
    exact = max(abs(ours[i].log_prob - sum(s.log_probs)) for i, s in zip(compared, scored))
    assert exact <= SCORE_BOUND
    # The search's own score: a mean over the tokens (beam) or a sum (greedy).
    per_token = max(abs(ours[i].score - results[i].scores[0]) / (1 if beam > 1 else len(theirs[i])) for i in compared)
    assert per_token <= SEARCH_SCORE_BOUND
    record_property(
        "figures",
        f"beam {beam}: {len(compared)}/{len(src)} identical, {len(capped)} capped; |Δ log p| vs score_batch "
        f"{exact:.1e}, vs the search's score {per_token:.1e} a token",
    )
