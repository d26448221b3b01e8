"""What GetModelInfo says of one served model version: its manifest's dims and generation
defaults, how it is served, and the server's limits with what each option left at 0 means."""

from __future__ import annotations

from contract.manifest import Manifest
from service.batching.calibration import FIELDS, Batching
from service.engine import documents
from service.engine.terms import MAX_TERM_CHARS, MAX_TERM_WORDS
from service.settings import Settings


def describe(
    name: str,
    version: str,
    m: Manifest,
    st: Settings,
    default_pair: bool,
    provider: str,
    graph: str,
    notes: list[str],
    glossaries: list[str] | None = None,
    batching: Batching | None = None,
) -> dict:
    """GetModelInfo's fields of a version served as `name`:`version` with `provider` and `graph`
    (`default_pair`: whether requests may leave the languages out; a multilingual model shows none;
    `batching`: the batching values in force and where each came from, None: the settings' own)."""
    d = m.dims
    return {
        "name": name,
        "version": version,
        # A model that needs the request's languages has no default pair to show.
        "source_language": m.src_lang if default_pair else "",
        "target_language": m.tgt_lang if default_pair else "",
        "precision": st.precision,
        "execution_provider": provider,
        "decoder_graph": graph,
        "notes": list(notes),
        "glossaries": list(glossaries or []),
        "vocab_size": d.vocab_size,
        "d_model": d.d_model,
        "n_heads": d.n_heads,
        "n_encoder_layers": d.n_encoder_layers,
        "n_decoder_layers": d.n_decoder_layers,
        "max_positions": d.max_positions,
        "opset": m.opset,
        "max_len_a": m.generation.max_len_a,
        "max_len_b": m.generation.max_len_b,
        "length_penalty": m.generation.length_penalty,
        "files_sha256": m.checksums(st.precision, graph) if m.has(st.precision, graph) else {},
        "tool_versions": dict(m.tool_versions),
        "batching": describe_batching(st, batching),
        "limits": {
            "max_texts_per_request": st.max_texts_per_request,
            "max_input_tokens": st.max_input_tokens,
            "max_output_tokens": st.max_output_tokens,
            "max_beam_size": st.max_beam_size,
            "default_beam_size": st.default_beam_size,
            "max_batch_sentences": st.max_batch_sentences,
            "max_batch_tokens": st.max_batch_tokens,
            "max_queue_size": st.max_queue_size,
            "max_text_bytes": st.max_text_bytes,
            "max_request_bytes": st.max_request_bytes,
            "max_glossary_terms": st.max_glossary_terms,
            "max_term_chars": MAX_TERM_CHARS,
            "max_term_words": MAX_TERM_WORDS,
            "detection_threshold": st.detection_threshold,
            "zero_means": zero_means(st, m),
        },
    }


def describe_batching(st: Settings, batching: Batching | None) -> dict:
    """GetModelInfo's `batching`: the values in `st` (those in force), where each came from, and
    the decoder step costs measured at load."""
    return {
        "max_queue_delay_ms": st.max_queue_delay_ms,
        "max_batch_sentences": st.max_batch_sentences,
        "max_batch_tokens": st.max_batch_tokens,
        "sources": dict(batching.sources) if batching is not None else dict.fromkeys(FIELDS, "setting"),
        "step_ms": {str(rows): ms for rows, ms in batching.costs.ms.items()}
        if batching is not None and batching.costs is not None
        else {},
    }


def zero_means(st: Settings, m: Manifest) -> dict[str, str]:
    """What each request option left at 0 (or unset) means here, with this server's numbers:
    GetModelInfo's `Limits.zero_means`, for clients that know the API from reflection alone."""
    gen = m.generation
    return {
        "options.beam_size": f"the server default, default_beam_size ({st.default_beam_size}); "
        f"1 = greedy search; at most max_beam_size ({st.max_beam_size})",
        "options.max_output_tokens": "no cap but the model's length rule "
        f"(max_len_a * source tokens + max_len_b = {gen.max_len_a:g} * n + {gen.max_len_b}) "
        f"and the server's max_output_tokens ({st.max_output_tokens}); else a cap of 1..{st.max_output_tokens}",
        "options.min_output_tokens": "no minimum: </s> may end the translation at any step; "
        "else at least that many tokens before </s>, below the cap on generated tokens",
        "options.length_penalty": f"unset: the model's length_penalty ({gen.length_penalty:g}); "
        "0 is 0 (scores not normalised by length); at most 10",
        "options.num_hypotheses": "1: no n-best list; else Translation.hypotheses holds the n best, "
        "at most the beam size (greedy search and sampling: 1)",
        "options.sampling_topk": "no sampling: greedy or beam search; 1 = greedy search; k > 1 draws each "
        "token among the k most likely (with 1 and k > 1 beam_size 0 means 1; sampling with beam_size > 1 "
        "is refused)",
        "options.sampling_topp": "unset: 1, no nucleus cut; else in (0, 1], and below 1 it samples "
        "(from the whole vocabulary when sampling_topk is 0)",
        "options.sampling_temperature": "unset: 1; else above 0 (the logits are divided by it when sampling)",
        "options.seed": "a random seed; else the same seed, texts and options give the same samples",
        "target_prefixes": "no forced prefix; else one per text, forced then decoded on, part of the "
        "translation (TranslateStreamRequest.target_prefix: the same for its text)",
        "timeout_ms": "no deadline of the item's own: only the stream's deadline applies",
        "options.split": "SPLIT_SENTENCES: each text is translated sentence by sentence (splitter rules of "
        f"{documents.splitter_language(m.src_lang)!r}), its whitespace and line breaks kept; texts "
        f"up to max_text_bytes ({st.max_text_bytes}) are never refused for length",
    }
