"""`mtserve import` of local Hugging Face Marian and M2M100 folders (export/hf/): the tokenizers
against transformers' on the 1,000 test sentences, the imported models against transformers
(greedy token for token, teacher-forced log-probabilities), the model dir and manifest they make,
and the folders it refuses, each with its own message, leaving the repository untouched.

The folders are tiny random models built offline by the session fixtures of tests/conftest.py."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from contract.manifest import ManifestError, load_manifest
from export.checkpoint import ConfigFormatError, load_config
from export.hf.config import HFImportError
from export.hf.importer import import_model
from export.hf.parity import TOLERANCE
from export.tokenizer import SentencePieceTokenizer

pytest.importorskip("transformers")
N_PARITY = 200


def _test_lines(data_dir: Path, lang: str) -> list[str]:
    import gzip

    with gzip.open(data_dir / f"test_2016_flickr.{lang}.gz", "rt", encoding="utf-8") as f:
        return [line.strip() for line in f]


def _marian_tokenizer(folder: Path, separate: bool) -> SentencePieceTokenizer:
    vocab = json.loads((folder / "vocab.json").read_text())
    special = {vocab["</s>"], vocab["<pad>"], vocab["<unk>"]}
    target_vocab = folder / ("target_vocab.json" if separate else "vocab.json")
    return SentencePieceTokenizer(
        folder / "source.spm", folder / "target.spm", folder / "vocab.json", target_vocab, vocab["<unk>"], special
    )


# ----------------------------------------------------------------------------- tokenizers


@pytest.mark.parametrize("separate", [False, True], ids=["shared", "separate"])
def test_marian_ids_equal_transformers(request, data_dir, separate):
    from transformers import MarianTokenizer

    folder = request.getfixturevalue("hf_marian_separate_dir" if separate else "hf_marian_dir")
    theirs = MarianTokenizer.from_pretrained(str(folder))
    ours = _marian_tokenizer(folder, separate)
    de, en = _test_lines(data_dir, "de"), _test_lines(data_dir, "en")
    assert len(de) == len(en) == 1000
    eos = theirs.eos_token_id
    assert [ours.encode(t) + [eos] for t in de] == theirs(de)["input_ids"]
    assert [ours.encode(t, target=True) + [eos] for t in en] == theirs(text_target=en)["input_ids"]
    target_ids = theirs(text_target=en[:100])["input_ids"]
    assert [ours.decode(ids) for ids in target_ids] == theirs.batch_decode(target_ids, skip_special_tokens=True)


def test_m2m100_ids_equal_transformers(hf_m2m100_dir, data_dir, tmp_path):
    from transformers import M2M100Tokenizer

    from export.hf.tokenizer import import_m2m100

    theirs = M2M100Tokenizer.from_pretrained(str(hf_m2m100_dir), src_lang="de", tgt_lang="en")
    imported = import_m2m100(hf_m2m100_dir, tmp_path, "de", "en")
    tokens = imported.languages["source_tokens"]
    assert tokens["de"] == theirs.get_lang_id("de") and set(tokens) == set(theirs.lang_code_to_id)
    drop = {0, 1, 2, 3, *tokens.values()}
    ours = SentencePieceTokenizer(
        tmp_path / "sentencepiece.bpe.model",
        tmp_path / "sentencepiece.bpe.model",
        tmp_path / "vocab.json",
        tmp_path / "vocab.json",
        imported.unk_id,
        drop,
    )
    de = _test_lines(data_dir, "de")
    assert [[tokens["de"], *ours.encode(t), theirs.eos_token_id] for t in de] == theirs(de)["input_ids"]
    ids = theirs(de[:100])["input_ids"]
    # transformers 5 keeps the `__xx__` token in skip_special_tokens decoding; mtserve drops it
    theirs_text = theirs.batch_decode([i[1:] for i in ids], skip_special_tokens=True)
    assert [ours.decode(i) for i in ids] == theirs_text


# ----------------------------------------------------------------------------- imports


@pytest.fixture(scope="module")
def imported(tmp_path_factory, data_dir, hf_marian_separate_dir, hf_m2m100_dir):
    """The separate-vocabulary Marian (GELU) and the M2M100 (ReLU) folders imported into one
    repository with the fp32 graphs (tests/mtserve/test_import.py imports every precision)."""
    repo = tmp_path_factory.mktemp("repo")
    texts = _test_lines(data_dir, "de")[:N_PARITY]
    return repo, {
        "marian": import_model(hf_marian_separate_dir, repo, "opus", texts=texts, precisions=("fp32",)),
        "m2m100": import_model(hf_m2m100_dir, repo, "m2m", texts=texts, precisions=("fp32",)),
    }


@pytest.mark.parametrize("which", ["marian", "m2m100"])
def test_import_matches_transformers(imported, which):
    report = imported[1][which]
    assert report["parity"]["sentences"] == N_PARITY
    assert report["parity"]["greedy_identical"] == N_PARITY
    assert report["parity"]["max_abs_log_prob_diff"] <= TOLERANCE
    assert report["onnx_parity"]["fp32"]["log_probs"] <= 1e-4


def test_marian_model_dir_and_manifest(imported, hf_marian_separate_dir):
    repo, reports = imported
    model_dir = repo / "opus" / "1"
    assert reports["marian"]["path"] == str(model_dir)
    cfg = load_config(model_dir)
    hf = json.loads((hf_marian_separate_dir / "config.json").read_text())
    assert (cfg.pre_norm, cfg.activation, cfg.logits_bias) == (False, "gelu", True)
    assert (cfg.src_vocab_size, cfg.vocab_size) == (hf["vocab_size"], hf["decoder_vocab_size"])
    assert cfg.decoder_start_id == cfg.pad_id == hf["pad_token_id"]
    m = load_manifest(model_dir / "onnx")
    assert m.format_version == 5 and m.tokenizer is None and m.sentencepiece is not None
    assert m.sentencepiece.target_vocab.file == "target_vocab.json"
    assert m.special_ids.start_id == cfg.pad_id
    assert (m.languages.source, m.languages.target, m.languages.target_tokens) == (["de"], ["en"], {})
    assert {"source.spm", "target.spm", "vocab.json", "target_vocab.json"} <= set(m.checksums())


def test_m2m100_languages_and_translation(imported, hf_m2m100_dir, data_dir):
    """The languages' tokens reach the manifest, and the torch translator (source token first,
    target token forced) gives transformers' greedy translation into French as text."""
    from transformers import M2M100ForConditionalGeneration, M2M100Tokenizer

    from export.translator import TorchTranslator

    repo, _ = imported
    model_dir = repo / "m2m" / "1"
    m = load_manifest(model_dir / "onnx")
    assert m.sentencepiece is not None and m.special_ids.start_id == m.special_ids.eos_id
    assert len(m.languages.source) == 8 and m.languages.target_tokens == m.languages.source_tokens
    tok = M2M100Tokenizer.from_pretrained(str(hf_m2m100_dir), src_lang="de")
    hf = M2M100ForConditionalGeneration.from_pretrained(str(hf_m2m100_dir)).eval()
    texts = _test_lines(data_dir, "de")[:16]
    batch = tok(texts, return_tensors="pt", padding=True)
    cs = tok.get_lang_id("cs")
    # mtserve's length rule: </s> at the last allowed step (transformers' forced_eos_token_id)
    out = hf.generate(
        **batch,
        num_beams=1,
        do_sample=False,
        max_new_tokens=20,
        forced_bos_token_id=cs,
        forced_eos_token_id=tok.eos_token_id,
    )
    ours = TorchTranslator(model_dir).translate(texts, src_lang="de", tgt_lang="cs", beam=1, max_len_a=0, max_len_b=20)
    # transformers 5 keeps the forced `__cs__` in skip_special_tokens decoding; mtserve drops it
    assert ours == [t.strip() for t in tok.batch_decode(out[:, 2:], skip_special_tokens=True)]
    assert len(set(ours)) > 1


# ----------------------------------------------------------------------------- refusals


def _edit_config(folder: Path, **changes) -> None:
    path = folder / "config.json"
    hf = json.loads(path.read_text())
    hf.update(changes)
    path.write_text(json.dumps(hf))


REFUSALS = {
    "architectures": ("marian", lambda f: _edit_config(f, architectures=["BartForConditionalGeneration"])),
    "activation_function": ("marian", lambda f: _edit_config(f, activation_function="tanh")),
    "normalize_before": ("marian", lambda f: _edit_config(f, normalize_before=True)),
    "add_final_layer_norm": ("marian", lambda f: _edit_config(f, add_final_layer_norm=True)),
    "layernorm_embedding": ("m2m100", lambda f: _edit_config(f, layernorm_embedding=True)),
    "normalize_before ": ("m2m100", lambda f: _edit_config(f, normalize_before=False)),
    "decoder_attention_heads": ("marian", lambda f: _edit_config(f, decoder_attention_heads=2)),
    "tokenizer_class": (
        "marian",
        lambda f: (f / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "BertTokenizer"})),
    ),
    "source.spm": ("marian", lambda f: (f / "source.spm").unlink()),
    "sentencepiece.bpe.model": ("m2m100", lambda f: (f / "sentencepiece.bpe.model").unlink()),
    "model.safetensors": ("marian", lambda f: (f / "model.safetensors").unlink()),
    "bad_words_ids": ("marian", lambda f: (f / "generation_config.json").write_text('{"bad_words_ids": [[3, 4]]}')),
}


@pytest.mark.parametrize("field", list(REFUSALS))
def test_refused_folder_names_the_field_and_writes_nothing(field, tmp_path, hf_marian_dir, hf_m2m100_dir):
    which, breaks = REFUSALS[field]
    folder = tmp_path / "hf"
    shutil.copytree(hf_marian_dir if which == "marian" else hf_m2m100_dir, folder)
    breaks(folder)
    repo = tmp_path / "repo"
    (repo / "existing" / "1").mkdir(parents=True)
    before = sorted(p.relative_to(repo) for p in repo.rglob("*"))
    for name in ("existing", "new"):
        with pytest.raises(HFImportError, match=field.strip().replace(".", r"\.")):
            import_model(folder, repo, name, precisions=("fp32",))
    assert sorted(p.relative_to(repo) for p in repo.rglob("*")) == before


def test_newer_formats_are_refused(imported, tmp_path):
    repo, _ = imported
    model_dir = tmp_path / "model"
    shutil.copytree(repo / "opus" / "1", model_dir)
    manifest = model_dir / "onnx" / "manifest.json"
    for version, message in ((6, "newer than this server reads"), (4, "export again")):
        data = json.loads(manifest.read_text())
        manifest.write_text(json.dumps({**data, "format_version": version}))
        with pytest.raises(ManifestError, match=message):
            load_manifest(model_dir / "onnx", verify_checksums=False)
    config = model_dir / "config.json"
    config.write_text(json.dumps({**json.loads(config.read_text()), "format": 3}))
    with pytest.raises(ConfigFormatError, match="format 3"):
        load_config(model_dir)


def test_marian_ids_past_its_vocabulary_are_unmapped(hf_marian_dir, tmp_path):
    """An embedding padded past the vocabulary (as OPUS-MT's can be) imports, its extra rows
    recorded as unmapped; a vocabulary past the embedding is refused."""
    from export.hf.tokenizer import import_marian

    size = len(json.loads((hf_marian_dir / "vocab.json").read_text()))
    assert import_marian(hf_marian_dir, tmp_path, None, None, size + 5).unmapped == list(range(size, size + 5))
    assert import_marian(hf_marian_dir, tmp_path, None, None, size).unmapped == []
    with pytest.raises(HFImportError, match="past the model's vocabulary"):
        import_marian(hf_marian_dir, tmp_path, None, None, size - 1)
