"""The serving path's greedy search over an imported model's ONNX fp32 graphs against transformers'
own generate(num_beams=1), token for token, on 200 test sentences: Marian (decoder start <pad>,
final_logits_bias; separate vocabularies with GELU, and one shared vocabulary with swish) and
M2M100 (source language token, decoder start </s>, target language token
forced first), on the fused decoder step."""

from __future__ import annotations

import gzip
from pathlib import Path

import pytest
import torch

from service.decoding.generator import generate
from service.runtime.onnx_model import OnnxSeq2Seq
from tests.service.imported import M2M100, MARIAN

SHARED = "opus-shared"  # the shared-vocabulary swish Marian, imported here
N_SENTENCES = 200
MAX_LEN = 40  # tokens each side may emit, </s> (and the forced language token) included

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def hf_greedy(folder, src: list[list[int]], start: int, forced: int | None, pad: int, eos: int) -> list[list[int]]:
    """transformers' greedy outputs, without the start token, the forced one and what follows </s>."""
    from transformers import AutoModelForSeq2SeqLM

    hf = AutoModelForSeq2SeqLM.from_pretrained(str(folder), local_files_only=True).float().eval()
    out: list[list[int]] = []
    for i in range(0, len(src), 50):
        batch = src[i : i + 50]
        ids = torch.full((len(batch), max(map(len, batch))), pad, dtype=torch.long)
        for r, s in enumerate(batch):
            ids[r, : len(s)] = torch.tensor(s)
        with torch.no_grad():
            gen = hf.generate(
                input_ids=ids,
                attention_mask=(ids != pad).long(),
                num_beams=1,
                do_sample=False,
                max_new_tokens=MAX_LEN,
                forced_eos_token_id=eos,
                forced_bos_token_id=forced,
                decoder_start_token_id=start,
            )
        for row in gen[:, 1 + (forced is not None) :].tolist():
            out.append(row[: row.index(eos)] if eos in row else row)
    return out


@pytest.fixture(scope="module")
def shared_swish_import(tmp_path_factory, hf_marian_dir) -> Path:
    """The Marian with one shared vocabulary and swish (OPUS-MT's layout), imported in fp32."""
    from export.hf.importer import import_model

    repo = tmp_path_factory.mktemp("shared-swish")
    import_model(hf_marian_dir, repo, SHARED, version=1, precisions=("fp32",))
    return repo


@pytest.fixture()
def folders_and_repos(request, imported_models, hf_folders, hf_marian_dir) -> dict[str, tuple[Path, Path]]:
    """{model name: (its Hugging Face folder, the repository it is imported into)}."""
    shared = request.getfixturevalue("shared_swish_import") if request.node.callspec.params["name"] == SHARED else None
    return {
        MARIAN: (hf_folders["marian"], imported_models),
        M2M100: (hf_folders["m2m100"], imported_models),
        **({SHARED: (hf_marian_dir, shared)} if shared is not None else {}),
    }


@pytest.mark.parametrize("graph", ["fused"])  # the CPU default; test_generator.py: both steps decode alike
@pytest.mark.parametrize("name", [MARIAN, SHARED, M2M100])  # separate vocabularies + GELU, shared + swish, ReLU
def test_onnx_greedy_is_token_identical_to_transformers(folders_and_repos, data_dir, name, graph):
    folder, repo = folders_and_repos[name]
    model = OnnxSeq2Seq(repo / name / "1", precision="fp32", graph=graph)
    with gzip.open(data_dir / "test_2016_flickr.de.gz", "rt", encoding="utf-8") as f:
        texts = [line.strip() for line in f][:N_SENTENCES]
    src = model.source_ids(texts)  # M2M100: the de token first
    forced = model.prefixes()[1]  # M2M100: the en token
    ours = generate(
        model, src, beam=1, max_len_a=0.0, max_len_b=MAX_LEN, target_prefixes=[forced] * len(src), want_scores=False
    )
    theirs = hf_greedy(folder, src, model.start_id, forced[0] if forced else None, model.pad_id, model.eos_id)
    assert len(ours) == len(theirs) == N_SENTENCES
    same = sum(h.tokens == t for h, t in zip(ours, theirs))
    assert same == N_SENTENCES, f"{same}/{N_SENTENCES} identical"
    assert len({tuple(t) for t in theirs}) >= 10  # outputs that depend on the source (random tiny models)
