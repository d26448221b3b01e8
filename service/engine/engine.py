"""The translation engine of one model version: validation, tokenisation, the split of a request
into sentences for its backend, and the reassembly of their results in request order.
`Engine.translate` (Translate), `Engine.translate_stream` (TranslateStream, service.engine.streaming)
and `Engine.encode` (Encode); TranslateMany runs each of its items as a Translate call through
service.engine.many.translate_many. No gRPC here: callers get the domain objects of
service.engine.requests and `ServiceError`s."""

from __future__ import annotations

import asyncio
import dataclasses
import math
import time
from collections.abc import AsyncIterator

import numpy as np

from contract.manifest import Manifest
from service import tracing
from service.batching.jobs import EncodeJob, Sentence, new_request
from service.decoding.generator import Finished, max_output_len
from service.decoding.sampling import Sampling, sampling_rng
from service.engine import documents, work
from service.engine.backend import Backend
from service.engine.inference import Inference
from service.engine.languages import LanguagePair, ModelLanguages, Prefixes
from service.engine.requests import (
    Alignment,
    Alternative,
    Chunk,
    EncodingResult,
    TranslateOptions,
    TranslationResult,
)
from service.engine.streaming import translate_stream
from service.engine.text import normalize_text
from service.engine.work import NO_CHECK, Checkpoint
from service.errors import Cancelled, DeadlineExceeded, Internal, InvalidArgument, quote
from service.metrics import ModelMetrics
from service.runtime.tokenizer import TextTokenizer
from service.settings import Settings


def samples(opts: TranslateOptions) -> bool:
    """Whether `opts` ask for random sampling rather than greedy or beam search."""
    return opts.sampling_topk > 1 or (opts.sampling_topp is not None and opts.sampling_topp < 1.0)


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
        self.name, self.version = metrics.name, metrics.version  # as served: the repository's NAME/VERSION
        self.model_name = f"{self.name}:{self.version}"
        self.translation_model, self.encoder_model = model_names(self.name)
        self.work = work.shared(settings.text_threads)

    # -- validation and tokenisation --------------------------------------------------

    def _check_texts(self, texts: list[str]) -> None:
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
            n = _utf8_bytes(t)
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
            total += _utf8_bytes(p)
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

    def plans(
        self,
        texts: list[str],
        opts: TranslateOptions,
        pair: LanguagePair,
        prefixes: Prefixes,
        field: str = "texts",
        point: Checkpoint = NO_CHECK,
    ) -> list[documents.Plan]:
        """Each text's segments and source rows, as `opts.split` asks; `point` checked between
        texts and segments. INVALID_ARGUMENT for a text, or texts, of more rows than the queue
        holds (max_queue_size): such a request could never be queued."""
        if opts.split not in documents.SPLIT_MODES:
            raise InvalidArgument(
                "options.split", f"{quote(opts.split)} is not one of {', '.join(documents.SPLIT_MODES)}"
            )
        rules = documents.Rules(
            split=opts.split,
            language=pair.source or self.manifest.src_lang,
            lead=tuple(prefixes.source),
            eos_id=self.eos_id,
            limit=min(self.settings.max_input_tokens, self.manifest.dims.max_positions - 1),
            max_text_bytes=self.settings.max_text_bytes,
            max_rows=self.max_request_rows,
            rows_bound=self.rows_bound,
        )
        plans, rows = [], 0
        for i, t in enumerate(texts):
            point.check()
            name = f"{field}[{i}]" if field == "texts" else field
            plans.append(documents.plan_text(t, name, rules, self.tokenizer, point))
            rows += plans[-1].row_count
            if rows > rules.max_rows:
                raise InvalidArgument(name, f"{field} up to here make {rows} sentences, over {rules.rows_bound}")
        return plans

    @property
    def max_request_rows(self) -> int:
        """The most rows one request can queue: max_queue_size, or with engine processes the
        queue of one (each request goes to one, which has 1/N of max_queue_size)."""
        st = self.settings
        return -(-st.max_queue_size // st.decode_workers) if st.engine_process else st.max_queue_size

    @property
    def rows_bound(self) -> str:
        """max_request_rows as a status message names it."""
        st, rows = self.settings, self.max_request_rows
        if rows == st.max_queue_size:
            return f"max_queue_size ({rows}), the most one request can queue"
        return (
            f"the {rows} one request can queue (max_queue_size {st.max_queue_size} over {st.decode_workers} "
            "engine processes, a request in one)"
        )

    def row_options(
        self, opts: TranslateOptions, plans: list[documents.Plan], prefixes: Prefixes, field_prefix: str
    ) -> TranslateOptions:
        """`opts` for the rows of `plans`: each text's target prefix (checked against its text's
        field) goes to its first row only."""
        if all(p.row_count == 1 for p in plans) or not (opts.target_prefix or any(opts.target_prefixes)):
            return opts
        room = min(self._cap(opts), self.manifest.dims.max_positions - 1 - len(prefixes.target))
        self._output_prefixes(opts, len(plans), room, field_prefix)
        wanted = opts.target_prefixes or [opts.target_prefix] * len(plans)
        return dataclasses.replace(opts, target_prefix="", target_prefixes=documents.first_row_prefixes(wanted, plans))

    def count_texts(self, plans: list[documents.Plan]) -> None:
        self.metrics.texts.inc(len(plans))
        for p in plans:
            self.metrics.text_segments.observe(len(p.spans))
        self.metrics.split_rows.inc(sum(p.row_count - 1 for p in plans))

    def _assemble(
        self, plans: list[documents.Plan], rows: list[TranslationResult], split: str
    ) -> list[TranslationResult]:
        """Each text's translation from its rows' (in plan order)."""
        out, at = [], 0
        for p in plans:
            out.append(documents.assemble(p, rows[at : at + p.row_count], split))
            at += p.row_count
        return out

    def _mode(self, opts: TranslateOptions) -> tuple[int, float]:
        st, gen = self.settings, self.manifest.generation
        # sampling_topk 1 asks for greedy search, sampling for its greedy path: beam 1 by default.
        beam = opts.beam_size or (1 if opts.sampling_topk == 1 or samples(opts) else st.default_beam_size)
        if not 1 <= beam <= st.max_beam_size:
            raise InvalidArgument(
                "options.beam_size", f"{opts.beam_size} is outside 0..{st.max_beam_size} (0 = default)"
            )
        if not 0 <= opts.max_output_tokens <= st.max_output_tokens:
            raise InvalidArgument(
                "options.max_output_tokens",
                f"{opts.max_output_tokens} is outside 0..{st.max_output_tokens} (0 = default)",
            )
        lp = gen.length_penalty if opts.length_penalty is None else opts.length_penalty
        if not math.isfinite(lp) or not 0.0 <= lp <= 10.0:
            raise InvalidArgument("options.length_penalty", f"{opts.length_penalty} is outside 0..10")
        cap = self._cap(opts)
        if not 0 <= opts.min_output_tokens < cap:
            raise InvalidArgument(
                "options.min_output_tokens",
                f"{opts.min_output_tokens} is outside 0..{cap - 1} (below the cap of {cap} generated tokens, "
                "which counts the final </s>)",
            )
        self._check_search(opts, beam)
        return beam, float(lp)

    def _check_search(self, opts: TranslateOptions, beam: int) -> None:
        """num_hypotheses and the sampling options, against the `beam` the search runs with."""
        if not 0 <= opts.num_hypotheses <= beam:
            raise InvalidArgument(
                "options.num_hypotheses",
                f"{opts.num_hypotheses} is outside 0..{beam}: at most the beam size ({beam}; greedy search "
                "and sampling: 1), 0 = 1",
            )
        if opts.sampling_topk < 0:
            raise InvalidArgument("options.sampling_topk", f"{opts.sampling_topk} is negative (0 or 1 = no sampling)")
        topp, temperature = opts.sampling_topp, opts.sampling_temperature
        if topp is not None and not (math.isfinite(topp) and 0.0 < topp <= 1.0):
            raise InvalidArgument("options.sampling_topp", f"{topp} is outside (0, 1]")
        if temperature is not None and not (math.isfinite(temperature) and temperature > 0.0):
            raise InvalidArgument("options.sampling_temperature", f"{temperature} is not above 0")
        if not 0 <= opts.seed < 2**64:
            raise InvalidArgument("options.seed", f"{opts.seed} is outside 0..2**64-1 (0 = a random seed)")
        if samples(opts) and beam > 1:
            raise InvalidArgument(
                "options.beam_size", f"{beam}: sampling (sampling_topk > 1 or sampling_topp < 1) needs beam_size 1"
            )

    def _output_prefixes(
        self, opts: TranslateOptions, n: int, room: int, field_prefix: str, point: Checkpoint = NO_CHECK
    ) -> list[list[int]]:
        """Each text's requested target prefix as target token ids: `target_prefixes` (one per text),
        else `target_prefix` for every text. Each must leave room for </s> within `room` tokens."""
        if opts.target_prefixes:
            if len(opts.target_prefixes) != n:
                raise InvalidArgument(
                    f"{field_prefix}target_prefixes",
                    f"{len(opts.target_prefixes)} prefixes for {n} texts (give none, or one per text)",
                )
            texts, names = opts.target_prefixes, [f"{field_prefix}target_prefixes[{i}]" for i in range(n)]
        else:
            texts, names = [opts.target_prefix] * n, [f"{field_prefix}target_prefix"] * n
        out = []
        for text, name in work.checked(zip(texts, names), point):
            if len(text.encode("utf-8", "surrogatepass")) > self.settings.max_text_bytes:
                raise InvalidArgument(name, f"prefix exceeds max_text_bytes ({self.settings.max_text_bytes})")
            clean = normalize_text(text)  # as a source text: controls and format characters removed, NFC
            ids = self.tokenizer.encode_target(clean) if clean else []
            if len(ids) + 1 > room:
                raise InvalidArgument(
                    name,
                    f"{len(ids)} tokens leave no room for </s> within the cap of {room} generated tokens "
                    "(max_output_tokens, which counts the final </s>)",
                )
            out.append(ids)
        return out

    @staticmethod
    def _sampling(opts: TranslateOptions, n: int) -> list[Sampling | None]:
        """How each of `n` texts samples (None each unless `opts` sample): text i draws from a
        generator of its own, derived from the seed and i."""
        if not samples(opts):
            return [None] * n
        topp = 1.0 if opts.sampling_topp is None else float(opts.sampling_topp)
        temperature = 1.0 if opts.sampling_temperature is None else float(opts.sampling_temperature)
        topk = opts.sampling_topk if opts.sampling_topk > 1 else 0
        return [Sampling(topk, topp, temperature, sampling_rng(opts.seed, i)) for i in range(n)]

    def _cap(self, opts: TranslateOptions) -> int:
        """Generated tokens a sentence may have at most, </s> included: the request's
        max_output_tokens, else the server's, within the position table."""
        cap = opts.max_output_tokens or self.settings.max_output_tokens
        return min(cap, self.manifest.dims.max_positions - 1)

    def sentences(
        self,
        src: list[list[int]],
        opts: TranslateOptions,
        timeout: float | None,
        prefixes: Prefixes = Prefixes(),
        field_prefix: str = "",
        point: Checkpoint = NO_CHECK,
    ) -> list[Sentence]:
        """The sentences of `src` to queue. A sentence's max_len (tokens it may emit) is the model's
        length rule, which counts the forced target language token as the reference does, raised to
        fit min_output_tokens and the requested target prefix, within the request's cap; the cap and
        min_output_tokens count output tokens, the requested prefix included, without the language
        token (which the decoder emits first and leaves out of the output). They carry one request tag."""
        beam, lp = self._mode(opts)
        gen = self.manifest.generation
        cap = self._cap(opts)
        forced = list(prefixes.target)
        room = self.manifest.dims.max_positions - 1 - len(forced)  # the position table's room left
        kept = self._output_prefixes(opts, len(src), min(cap, room), field_prefix, point)
        sampling = self._sampling(opts, len(src))
        if timeout is not None and timeout <= 0:
            raise DeadlineExceeded("deadline expired before the request was queued")
        deadline = time.monotonic() + timeout if timeout is not None else None
        request = new_request()
        return [
            Sentence(
                src_ids=s,
                beam=beam,
                length_penalty=lp,
                max_len=min(
                    cap + len(forced),
                    room + len(forced),
                    max(
                        max(opts.min_output_tokens, len(k)) + 1 + len(forced),
                        max_output_len(len(s), gen.max_len_a, gen.max_len_b, self.manifest.dims.max_positions),
                    ),
                ),
                min_len=opts.min_output_tokens,
                target_prefix=forced,
                output_prefix=k,
                num_hypotheses=max(1, opts.num_hypotheses),
                sampling=how,
                want_alignment=opts.return_alignment,
                want_scores=opts.return_scores,
                deadline=deadline,
                request=request,
            )
            for s, k, how in work.checked(zip(src, kept, sampling), point)  # a large request's deadline
        ]

    def _token_strings(self, ids: list[int]) -> list[str]:
        """The vocabulary entries of `ids`. Every id comes from this tokenizer or from the model
        exported with it, so one without an entry means the export and the tokenizer disagree."""
        tokens: list[str] = []
        for i in ids:
            token = self.tokenizer.id_to_token(i)
            if token is None:
                raise Internal(f"token id {i} is not in the tokenizer's vocabulary")
            tokens.append(token)
        return tokens

    def result(self, src: list[int], finished: Finished, opts: TranslateOptions) -> TranslationResult:
        ids = list(finished.tokens)
        # Token strings only when the caller asked for them: this runs for every sentence.
        tokens = self._token_strings(ids) if opts.return_tokens or opts.return_alignment else []
        result = TranslationResult(
            text=self.tokenizer.decode(ids).strip(),
            score=None if finished.score is None else float(finished.score),
            tokens=tokens,
            token_ids=ids,
            input_tokens=len(src),
            output_tokens=len(ids) + 1,
        )
        if opts.return_alignment and finished.alignment is not None:
            result.alignment = Alignment(
                source_tokens=self._token_strings(src),
                target_tokens=tokens + ["</s>"],
                weights=np.asarray(finished.alignment, dtype=np.float32)[: len(ids) + 1, : len(src)],
            )
        result.hypotheses = [
            Alternative(
                text=self.tokenizer.decode(h.tokens).strip(),
                score=float("-inf") if h.score is None else float(h.score),
                tokens=self._token_strings(h.tokens) if opts.return_tokens else [],
                token_ids=list(h.tokens),
            )
            for h in finished.hypotheses
        ]
        return result

    # -- the calls ------------------------------------------------------------------------

    async def translate(
        self,
        texts: list[str],
        opts: TranslateOptions,
        timeout: float | None = None,
        pair: LanguagePair = LanguagePair(),
        field_prefix: str = "",
    ) -> list[TranslationResult]:
        """`pair`: the request's languages (a multilingual model needs them; `field_prefix` + the
        field names the one missing, "request." for a TranslateMany item)."""
        inference = Inference(self.metrics, self.translation_model)
        size = 0
        try:
            self._check_texts(texts)
            prefixes = self.languages.prefixes(pair, field_prefix)
            size = self.check_sizes(
                texts,
                prefixes=opts.target_prefixes or [opts.target_prefix],
                prefix_field=f"{field_prefix}target_prefix{'es' if opts.target_prefixes else ''}",
            )
            plans, src, sentences = await self.work.run(
                lambda point: self.prepare(texts, opts, pair, prefixes, field_prefix, point), size, timeout
            )
            self.trace(self.translation_model, sentences)
            inference.submit()
            self.scheduler.submit(sentences)  # all the rows of all the texts, or none
            self.count_texts(plans)
            futures = [asyncio.wrap_future(s.future) for s in sentences]
            try:
                finished = await asyncio.gather(*futures)
            except BaseException:
                for f in futures:  # a failed or cancelled request frees all its rows
                    f.cancel()
                raise
            inference.compute_done(sentences)
            results = await self.work.run(lambda _: self._results(plans, src, finished, opts), size)
        except BaseException:
            inference.failed()
            raise
        finally:
            if size > work.RELEASE_BYTES:  # what the request's work took, given back
                self.work.release_soon()
        inference.succeeded(len(texts))
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
    ) -> tuple[list[documents.Plan], list[list[int]], list[Sentence]]:
        """The CPU work before a request is queued (on the text pool, service.engine.work): the
        texts' plans, their rows' source ids and the sentences to queue."""
        plans = self.plans(texts, opts, pair, prefixes, field, point)
        src = [row for p in plans for segment in p.rows for row in segment]
        row_opts = self.row_options(opts, plans, prefixes, field_prefix)
        point.check()
        sentences = self.sentences(src, row_opts, point.remaining(), prefixes, field_prefix, point)
        return plans, src, sentences

    def _results(
        self, plans: list[documents.Plan], src: list[list[int]], finished: list[Finished], opts: TranslateOptions
    ) -> list[TranslationResult]:
        rows = [self.result(s, f, opts) for s, f in zip(src, finished)]
        return self._assemble(plans, rows, opts.split)

    def trace(self, model: str, sentences: list[Sentence] | None = None, texts: int = 0) -> None:
        """The model on the current (RPC) span, and the sentences' spans under it, when traced."""
        if tracing.tracer is not None:
            tracing.annotate({"mtserve.model": model, "mtserve.texts": len(sentences) if sentences else texts})
            if sentences:
                tracing.follow(sentences)

    def translate_stream(
        self, text: str, opts: TranslateOptions, timeout: float | None = None, pair: LanguagePair = LanguagePair()
    ) -> AsyncIterator[Chunk | TranslationResult]:
        """Chunks of the translation of `text` as they are decoded, then its result."""
        return translate_stream(self, text, opts, timeout, pair)

    async def encode(
        self,
        texts: list[str],
        return_token_embeddings: bool,
        timeout: float | None = None,
        pair: LanguagePair = LanguagePair(),
    ) -> list[EncodingResult]:
        """`pair`: a multilingual model's source language token leads each source, when it has one
        (the target language plays no part in encoding)."""
        inference = Inference(self.metrics, self.encoder_model)
        try:
            self._check_texts(texts)
            lead = self.languages.prefixes(pair, need_target=False)
            size = self.check_sizes(texts)
            started = time.monotonic()
            src = await self.work.run(lambda point: self.source_ids(texts, prefixes=lead, point=point), size, timeout)
            if timeout is not None:
                timeout -= time.monotonic() - started
            self.trace(self.encoder_model, texts=len(src))
            jobs = [EncodeJob(src_ids=s) for s in src]
            inference.submit()
            self.scheduler.submit_encode(jobs)
            futures = [asyncio.wrap_future(j.future) for j in jobs]
            try:
                memories = await asyncio.wait_for(asyncio.gather(*futures), timeout)
            except TimeoutError:
                raise DeadlineExceeded("deadline expired before the texts were encoded") from None
            except asyncio.CancelledError:
                for f in futures:
                    f.cancel()
                raise Cancelled("request cancelled") from None
            inference.compute_done()
            results = [
                EncodingResult(
                    pooled=m.mean(axis=0),
                    tokens=self._token_strings(s),
                    token_embeddings=m if return_token_embeddings else None,
                )
                for s, m in zip(src, memories)
            ]
        except BaseException:
            inference.failed()
            raise
        inference.succeeded(len(texts))
        return results

    def model_info(self) -> dict:
        m, d, st = self.manifest, self.manifest.dims, self.settings
        return {
            "name": self.name,
            "version": self.version,
            "source_language": m.src_lang,
            "target_language": m.tgt_lang,
            "precision": st.precision,
            "execution_provider": self.provider,
            "decoder_graph": self.graph,
            "notes": list(self.notes),
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
            "files_sha256": m.checksums(st.precision, self.graph) if m.has(st.precision, self.graph) else {},
            "tool_versions": dict(m.tool_versions),
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
                "zero_means": self.zero_means(),
            },
        }

    def zero_means(self) -> dict[str, str]:
        """What each request option left at 0 (or unset) means here, with this server's numbers:
        GetModelInfo's `Limits.zero_means`, for clients that know the API from reflection alone."""
        st, gen = self.settings, self.manifest.generation
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
            f"{documents.splitter_language(self.manifest.src_lang)!r}), its whitespace and line breaks kept; texts "
            f"up to max_text_bytes ({st.max_text_bytes}) are never refused for length",
        }


def _utf8_bytes(text: str) -> int:
    """UTF-8 bytes of `text` (lone surrogates as 3 bytes each)."""
    return len(text) if text.isascii() else len(text.encode("utf-8", "surrogatepass"))
