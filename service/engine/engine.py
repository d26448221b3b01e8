"""The translation engine of one model version: validation, tokenisation, the split of a request
into sentences for its backend, and the reassembly of their results in request order.
`Engine.translate` (Translate), service.engine.streaming.translate_stream (TranslateStream)
and `Engine.encode` (Encode); TranslateMany runs each of its items as a Translate call through
service.engine.many.translate_many. No gRPC here: callers get the domain objects of
service.engine.requests and `ServiceError`s."""

from __future__ import annotations

import dataclasses
import functools
import time
from collections.abc import Callable, Sequence
from typing import TypeVar

from contract.manifest import Manifest, resolve_onnx_dir
from service import tracing
from service.batching.calibration import Batching
from service.batching.jobs import Sentence
from service.decoding.results import Finished
from service.engine import (
    documents,
    encoding,
    glossary,
    markup_text,
    model_info,
    placement,
    plan_processes,
    row_results,
    work,
)
from service.engine.backend import Backend
from service.engine.inference import Inference
from service.engine.languages import LanguagePair, ModelLanguages, Prefixes
from service.engine.requests import (
    TEXT,
    EncodingResult,
    TranslateOptions,
    TranslationResult,
)
from service.engine.search_options import SearchOptions
from service.engine.terms import Match
from service.engine.text import normalize_text, utf8_bytes
from service.engine.work import NO_CHECK, Checkpoint
from service.errors import InvalidArgument, quote
from service.metrics import ModelMetrics
from service.runtime.tokenizer import TextTokenizer
from service.settings import Settings

T = TypeVar("T")


def model_names(name: str) -> tuple[str, str]:
    """The names a served model has in KServe, (translation model, encoder model): also the
    `model` label of the per-model inference metrics that ModelStatistics reports."""
    return name, f"{name}-encoder"


class Engine:
    def __init__(
        self,
        settings: Settings,
        manifest: Manifest,
        tokenizer: TextTokenizer,
        scheduler: Backend,
        metrics: ModelMetrics,
        provider: str,
        graph: str = "portable",
    ):
        self.settings, self.manifest, self.tokenizer = settings, manifest, tokenizer
        self.scheduler, self.metrics, self.provider = scheduler, metrics, provider
        self.graph = graph  # the decoder step the backend runs: "fused", "portable" or a custom backend's
        self.eos_id = manifest.special_ids.eos_id
        self.languages = ModelLanguages(manifest.languages)
        self.notes: list[str] = []  # how this version is served where it differs from what was asked (GetModelInfo)
        self.batching: Batching | None = None  # the batching values in force and their sources, set by its loader
        self.name, self.version = metrics.name, metrics.version  # as served: the repository's NAME/VERSION
        self.model_name = f"{self.name}:{self.version}"
        self.translation_model, self.encoder_model = model_names(self.name)
        self.work = work.shared(settings.text_threads)
        self.search = SearchOptions(settings, manifest, tokenizer)
        # The named glossaries this version ships (service.engine.glossary), set by its loader.
        self.glossaries: dict[str, glossary.NamedGlossary] = {}
        # How often its glossary rows need their terms' spans alone (service.engine.placement).
        self.anchoring = placement.Anchoring()

    @functools.cached_property
    def target_words(self) -> placement.TargetWords:
        """The target vocabulary's word-internal pieces, banned right after a term, and its
        tokens that differ in case alone (service.engine.placement): made at the first request
        with terms, not at load (a walk over the whole vocabulary)."""
        return placement.target_words(self.tokenizer, self.manifest.dims.vocab_size)

    # -- validation and tokenisation --------------------------------------------------

    def check_texts(self, texts: list[str]) -> None:
        """INVALID_ARGUMENT for no texts, or more than max_texts_per_request."""
        if not texts:
            raise InvalidArgument("texts", "at least one text is required")
        if len(texts) > self.settings.max_texts_per_request:
            raise InvalidArgument(
                "texts", f"{len(texts)} texts exceed max_texts_per_request ({self.settings.max_texts_per_request})"
            )

    def check_sizes(
        self, texts: list[str], field: str = "texts", prefixes: list[str] | None = None, prefix_field: str = ""
    ) -> int:
        """The UTF-8 bytes of `texts` and `prefixes` (target prefixes), checked on the event loop
        before any other work: INVALID_ARGUMENT naming the text past max_text_bytes, or the one
        whose bytes take the request past max_request_bytes."""
        st = self.settings
        total = 0
        for i, t in enumerate(texts):
            name = f"{field}[{i}]" if field == "texts" else field
            # The size limit first, on the text as sent: it bounds the normalisation's work too.
            n = utf8_bytes(t)
            if total <= work.RELEASE_BYTES < total + n:  # a large request: its memory given back after it
                self.work.release_soon()
            if n > st.max_text_bytes:
                raise InvalidArgument(name, f"text exceeds max_text_bytes ({st.max_text_bytes}): {n} bytes")
            total += n
            if total > st.max_request_bytes:
                raise InvalidArgument(
                    name, f"{field} up to here hold {total} bytes, over max_request_bytes ({st.max_request_bytes})"
                )
        for p in prefixes or []:
            total += utf8_bytes(p)
        if total > st.max_request_bytes:
            raise InvalidArgument(
                prefix_field, f"texts and prefixes hold {total} bytes, over max_request_bytes ({st.max_request_bytes})"
            )
        return total

    def source_ids(
        self, texts: list[str], field: str = "texts", prefixes: Prefixes = Prefixes(), point: Checkpoint = NO_CHECK
    ) -> list[list[int]]:
        """Each text's source row: [source language token] + its ids + [</s>], all of which count
        against max_input_tokens. `point` is checked between texts."""
        limit = min(self.settings.max_input_tokens, self.manifest.dims.max_positions - 1)
        lead = list(prefixes.source)
        clean = []
        self.check_sizes(texts, field)
        for i, t in enumerate(texts):
            point.check()
            name = f"{field}[{i}]" if field == "texts" else field
            c = normalize_text(t)
            if not c:
                raise InvalidArgument(name, "text is empty once whitespace, control and format characters are removed")
            clean.append(c)
        # One text at a time on this thread: `encode_batch` hands even one text to the tokenizers'
        # thread pool and blocks the event loop until a pool thread, competing with the decode
        # workers for the cores, has run it (a tenth of the loop's time at c64, docs/performance.md).
        ids = [lead + self.tokenizer.encode(c) for c in clean]
        for i, s in enumerate(ids):
            if len(s) + 1 > limit:
                name = f"{field}[{i}]" if field == "texts" else field
                raise InvalidArgument(name, f"{len(s) + 1} tokens exceed max_input_tokens ({limit})")
        return [s + [self.eos_id] for s in ids]

    # -- texts as documents (service.engine.documents) ----------------------------------

    def rules(self, opts: TranslateOptions, pair: LanguagePair, prefixes: Prefixes) -> documents.Rules:
        """What planning a request's texts needs (INVALID_ARGUMENT for an unknown split mode)."""
        if opts.split not in documents.SPLIT_MODES:
            raise InvalidArgument(
                "options.split", f"{quote(opts.split)} is not one of {', '.join(documents.SPLIT_MODES)}"
            )
        return documents.Rules(
            split=opts.split,
            language=pair.source or self.manifest.src_lang,
            lead=tuple(prefixes.source),
            eos_id=self.eos_id,
            limit=min(self.settings.max_input_tokens, self.manifest.dims.max_positions - 1),
            max_text_bytes=self.settings.max_text_bytes,
            max_rows=self.search.max_request_rows,
            rows_bound=self.search.rows_bound,
        )

    def plans(
        self,
        texts: list[str],
        opts: TranslateOptions,
        pair: LanguagePair,
        prefixes: Prefixes,
        field: str = "texts",
        point: Checkpoint = NO_CHECK,
        offsets: bool = False,
    ) -> list[documents.Plan]:
        """Each text's segments and source rows (`offsets`: and token spans), as `opts.split` asks;
        `point` checked between texts and segments. INVALID_ARGUMENT for a text, or texts, of more
        rows than the queue holds (max_queue_size): such a request could never be queued."""
        rules = dataclasses.replace(self.rules(opts, pair, prefixes), offsets=offsets)
        return documents.plan_texts(texts, field, rules, self.tokenizer, point)

    async def far_plans(
        self,
        texts: list[str],
        opts: TranslateOptions,
        pair: LanguagePair,
        prefixes: Prefixes,
        size: int,
        timeout: float | None,
    ) -> list[documents.Plan] | None:
        """The plans of a request of more than work.INLINE_BYTES of text, made in the plan
        processes (service.engine.plan_processes) when the server has them (text_processes);
        None: the request is planned on the text threads."""
        if self.settings.text_processes == 0 or size <= work.INLINE_BYTES:
            return None
        rules = self.rules(opts, pair, prefixes)
        processes = plan_processes.shared(self.settings.text_processes)
        return await processes.plans(resolve_onnx_dir(self.settings.graphs_dir), texts, "texts", rules, timeout)

    def row_options(
        self, opts: TranslateOptions, plans: list[documents.Plan], prefixes: Prefixes, field_prefix: str
    ) -> TranslateOptions:
        """`opts` for the rows of `plans`: each text's target prefix (checked against its text's
        field) goes to its first row only."""
        if all(p.row_count == 1 for p in plans) or not (opts.target_prefix or any(opts.target_prefixes)):
            return opts
        room = min(self.search.cap(opts), self.manifest.dims.max_positions - 1 - len(prefixes.target))
        self.search.output_prefixes(opts, len(plans), room, field_prefix)
        wanted = opts.target_prefixes or [opts.target_prefix] * len(plans)
        return dataclasses.replace(opts, target_prefix="", target_prefixes=documents.first_row_prefixes(wanted, plans))

    def count_texts(
        self, plans: list[documents.Plan], groups: Sequence[int] | None = None, text_type: str = TEXT
    ) -> None:
        """The texts accepted, their segments and the rows their splitting added: one text per
        plan, or (`groups`) per run of that many plans (a marked-up text's blocks; 0: a text
        without any, which queues no row and counts in mtserve_text_types_total alone)."""
        m = self.metrics
        if groups is None:
            m.texts.inc(len(plans))
            m.text_types.labels(text_type).inc(len(plans))
            for p in plans:
                m.text_segments.observe(len(p.spans))
            m.split_rows.inc(sum(p.row_count - 1 for p in plans))
            return
        m.text_types.labels(text_type).inc(len(groups))
        at = 0
        for n in groups:
            if not n:
                continue
            mine = plans[at : at + n]
            at += n
            m.texts.inc()
            m.text_segments.observe(sum(len(p.spans) for p in mine))
            m.split_rows.inc(sum(p.row_count for p in mine) - 1)

    def _assemble(
        self, plans: list[documents.Plan], rows: list[TranslationResult], split: str
    ) -> list[TranslationResult]:
        """Each text's translation from its rows' (in plan order)."""
        out, at = [], 0
        for p in plans:
            out.append(documents.assemble(p, rows[at : at + p.row_count], split))
            at += p.row_count
        return out

    def result(self, src: list[int], finished: Finished, opts: TranslateOptions) -> TranslationResult:
        """One row's translation (service.engine.row_results)."""
        return row_results.row_result(self.tokenizer, self.manifest.dims.vocab_size, src, finished, opts)

    # -- the calls ------------------------------------------------------------------------

    async def translate(
        self,
        texts: list[str],
        opts: TranslateOptions,
        timeout: float | None = None,
        pair: LanguagePair = LanguagePair(),
        field_prefix: str = "",
        terms: list[tuple[Match, ...]] | None = None,
    ) -> list[TranslationResult]:
        """`pair`: the request's languages (a multilingual model needs them; `field_prefix` + the
        field names the one missing, "request." for a TranslateMany item). `terms`: per text, spans
        of the text as sent that the caller wants kept, forced as do-not-translate phrases before
        the glossary's (service.engine.glossary). Texts of `opts.text_type` "html" or "xml" go to
        service.engine.markup_text (which passes their translate="no" spans as `terms`)."""
        if opts.text_type != TEXT:
            return await markup_text.translate_markup(self, texts, opts, timeout, pair, field_prefix)
        inference = Inference(self.metrics, self.translation_model)
        try:
            self.check_texts(texts)
        except BaseException:
            inference.failed()
            raise
        return await self.translate_rows(
            texts,
            opts,
            timeout,
            pair,
            field_prefix,
            inference,
            lambda plans, src, finished, found: self._results(plans, src, finished, opts, found),
            terms=terms,
        )

    async def translate_rows(
        self,
        texts: list[str],
        opts: TranslateOptions,
        timeout: float | None,
        pair: LanguagePair,
        field_prefix: str,
        inference: Inference,
        finish: Callable[[list[documents.Plan], list[list[int]], list[Finished], glossary.TermPlan | None], list[T]],
        groups: Sequence[int] | None = None,
        text_type: str = TEXT,
        terms: list[tuple[Match, ...]] | None = None,
    ) -> list[T]:
        """`texts` (checked by the caller: how many, and none empty) planned, queued together
        and decoded; `finish(plans, source rows, finished rows, the glossary's matches)` makes the
        results, on the text pool. `groups`: how many of `texts` stand for each text of the
        request (a marked-up text's blocks), which the metrics count; None: each is one. `terms`:
        as `translate`'s, per one of `texts`."""
        size = 0
        try:
            wanted = self.request_terms(opts, field_prefix, terms, len(texts))
            prefixes = self.languages.prefixes(pair, field_prefix)
            size = self.check_sizes(
                texts,
                prefixes=opts.target_prefixes or [opts.target_prefix],
                prefix_field=f"{field_prefix}target_prefix{'es' if opts.target_prefixes else ''}",
            )
            deadline = None if timeout is None else time.monotonic() + timeout
            planned = await self.far_plans(texts, opts, pair, prefixes, size, timeout)
            plans, src, sentences, found = await self.work.run(
                lambda point: self.prepare(
                    texts, opts, pair, prefixes, field_prefix, point, planned=planned, terms=wanted
                ),
                size,
                None if deadline is None else deadline - time.monotonic(),
            )
            self.trace(self.translation_model, sentences)
            inference.submit()
            # All the rows of all the texts, or none; rows with terms in two passes (service.engine.placement).
            decoding = placement.Decoding(
                self.scheduler, sentences, self.target_words, len(prefixes.source), self.anchoring
            )
            self.count_texts(plans, groups, text_type)
            finished = await decoding.results()
            inference.compute_done(sentences)
            results = await self.work.run(lambda _: finish(plans, src, finished, found), size)
        except BaseException:
            inference.failed()
            raise
        finally:
            if size > work.RELEASE_BYTES:  # what the request's work took, given back
                self.work.release_soon()
        inference.succeeded(len(texts) if groups is None else len(groups))
        return results

    def prepare(
        self,
        texts: list[str],
        opts: TranslateOptions,
        pair: LanguagePair,
        prefixes: Prefixes,
        field_prefix: str,
        point: Checkpoint,
        field: str = "texts",
        planned: list[documents.Plan] | None = None,
        terms: glossary.RequestTerms | None = None,
    ) -> tuple[list[documents.Plan], list[list[int]], list[Sentence], glossary.TermPlan | None]:
        """The CPU work before a request is queued (on the text pool, service.engine.work): the
        texts' plans (unless `planned`), their rows' source ids, the sentences to queue, and the
        matches of `terms` (request_terms) in the texts, forced on their sentences."""
        # The token spans for the markup's alignment (it asks for one) and the glossary's matching.
        offsets = opts.return_alignment or terms is not None
        plans = planned if planned is not None else self.plans(texts, opts, pair, prefixes, field, point, offsets)
        src = [row for p in plans for segment in p.rows for row in segment]
        found = None
        if terms is not None:
            unk = self.manifest.special_ids.unk_id
            found = glossary.place(terms, plans, self.tokenizer, len(prefixes.source), unk, field, point)
        row_opts = self.row_options(opts, plans, prefixes, field_prefix)
        point.check()
        sentences = self.search.sentences(src, row_opts, point.remaining(), prefixes, field_prefix, point)
        if found is not None:
            for s, row_terms in zip(sentences, found.rows):
                s.terms = row_terms
                s.pieces = self.target_words.pieces if row_terms else None
        return plans, src, sentences, found

    def request_terms(
        self,
        opts: TranslateOptions,
        field_prefix: str = "",
        markup: list[tuple[Match, ...]] | None = None,
        texts: int = 1,
    ) -> glossary.RequestTerms | None:
        """The request's glossary terms, do-not-translate phrases and named glossary, checked
        (service.engine.glossary.request_terms); None: it has none."""
        limit = self.settings.max_glossary_terms
        return glossary.request_terms(opts, self.glossaries, limit, self.model_name, field_prefix, markup, texts)

    def applied_terms(
        self,
        found: glossary.TermPlan | None,
        plans: list[documents.Plan],
        rows: list[TranslationResult],
        finished: list[Finished],
        results: list[TranslationResult],
        split: str,
    ) -> None:
        """Each result's `applied_terms` (where its matches landed), counted in the metrics."""
        if found is not None:
            glossary.applied(found, plans, rows, finished, results, self.tokenizer, split)
            glossary.count(results, self.metrics)

    def _results(
        self,
        plans: list[documents.Plan],
        src: list[list[int]],
        finished: list[Finished],
        opts: TranslateOptions,
        found: glossary.TermPlan | None = None,
    ) -> list[TranslationResult]:
        rows = [self.result(s, f, opts) for s, f in zip(src, finished)]
        results = self._assemble(plans, rows, opts.split)
        self.applied_terms(found, plans, rows, finished, results, opts.split)
        for r in results:
            r.model = self.model_name
        return results

    def trace(self, model: str, sentences: list[Sentence] | None = None, texts: int = 0) -> None:
        """The model on the current (RPC) span, and the sentences' spans under it, when traced."""
        if tracing.tracer is not None:
            tracing.annotate({"mtserve.model": model, "mtserve.texts": len(sentences) if sentences else texts})
            if sentences:
                tracing.follow(sentences)

    async def encode(
        self,
        texts: list[str],
        return_token_embeddings: bool,
        timeout: float | None = None,
        pair: LanguagePair = LanguagePair(),
    ) -> list[EncodingResult]:
        """Encode (service.engine.encoding)."""
        return await encoding.encode(self, texts, return_token_embeddings, timeout, pair)

    def model_info(self) -> dict:
        """GetModelInfo's fields for this version (service.engine.model_info)."""
        return model_info.describe(
            self.name,
            self.version,
            self.manifest,
            self.settings,
            self.languages.has_default_pair,
            self.provider,
            self.graph,
            self.notes,
            sorted(self.glossaries),
            self.batching,
        )
