"""TranslateStream: one text, its translation sent as chunks of text as the decoder emits tokens,
then the full result. The engine validates, splits the text into segments (options.split) and
tokenises; all the rows run at once, and this module follows them in document order: the text
between segments as it was sent, then each sentence's chunks as its decoder steps come. Markup
(options.text_type html, xml) comes as one chunk once translated (service.engine.markup_text)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncGenerator, AsyncIterator
from typing import TYPE_CHECKING

from service.batching.jobs import Sentence
from service.engine import documents, glossary, markup_text
from service.engine.inference import Inference
from service.engine.languages import LanguagePair
from service.engine.requests import TEXT, Chunk, TranslateOptions, TranslationResult

if TYPE_CHECKING:
    from service.engine.engine import Engine


async def translate_stream(
    engine: Engine, text: str, opts: TranslateOptions, timeout: float | None = None, pair: LanguagePair = LanguagePair()
) -> AsyncIterator[Chunk | TranslationResult]:
    """Chunks of the translation of `text` as they are decoded, then its TranslationResult. The
    chunks' texts add up to the result's: the whitespace between sentences (SPLIT_NONE: none)
    and each sentence's translation (its parts, for one cut for length, joined by a space).
    Markup (options.text_type "html" or "xml"), whose tags are placed once a block's words are
    all there, comes as one chunk, the whole translation, when it is done."""
    if opts.text_type != TEXT:  # an unknown type is refused there, after the text's size
        start = time.perf_counter()
        (result,) = await markup_text.translate_markup(engine, [text], opts, timeout, pair, field="text")
        engine.metrics.time_to_first_chunk.observe(time.perf_counter() - start)
        yield Chunk(text=result.text, token_ids=list(result.token_ids))
        yield result
        return
    inference = Inference(engine.metrics, engine.translation_model)
    plan, src, rows, start, found = await _submit(engine, text, opts, timeout, inference, pair)
    keep_gaps = opts.split != documents.SPLIT_NONE
    results: list[TranslationResult] = []
    first = True
    try:
        at, r = 0, 0
        for (a, b), parts in zip(plan.spans, plan.rows):
            if keep_gaps and a > at:
                yield Chunk(text=text[at:a], token_ids=[])
            at = b
            for k in range(len(parts)):
                if k:
                    yield Chunk(text=" ", token_ids=[])
                async with contextlib.aclosing(_follow(engine, src[r], *rows[r], opts)) as events:
                    async for event in events:
                        if isinstance(event, TranslationResult):
                            results.append(event)
                            continue
                        if first:
                            engine.metrics.time_to_first_chunk.observe(time.perf_counter() - start)
                            first = False
                        yield event
                r += 1
        if keep_gaps and at < len(text):
            yield Chunk(text=text[at:], token_ids=[])
        inference.compute_done([sentence for sentence, _ in rows])
        result = documents.assemble(plan, results, opts.split)
        finished = [sentence.future.result() for sentence, _ in rows]
        engine.applied_terms(found, [plan], results, finished, [result], opts.split)
        result.model = engine.model_name
        inference.succeeded(1)
        yield result
    except BaseException:
        inference.failed()  # no-op once succeeded: the client may go away after the result
        raise
    finally:
        for sentence, _ in rows:  # every exit: nothing of this call stays queued
            sentence.future.cancel()


async def _follow(
    engine: Engine, src: list[int], sentence: Sentence, steps: asyncio.Queue[list[int]], opts: TranslateOptions
) -> AsyncGenerator[Chunk | TranslationResult, None]:
    """Chunks of one row's translation as its decoder steps come, then its TranslationResult (with
    a last chunk first when the result's text is not what the chunks added up to). A chunk holds
    whole characters only: text that ends in an incomplete UTF-8 sequence waits for the next token.
    The forced target language token of a multilingual model is no part of the translation."""
    forced = len(sentence.target_prefix)  # the first tokens emitted, never shown
    done = asyncio.wrap_future(sentence.future)
    ids: list[int] = []
    sent = ""
    getter: asyncio.Future[list[int]] | None = None
    try:
        while True:
            getter = asyncio.ensure_future(steps.get())
            await asyncio.wait({getter, done}, return_when=asyncio.FIRST_COMPLETED)
            if not getter.done():
                break
            new = [t for t in getter.result() if t != engine.eos_id]
            skip, forced = min(forced, len(new)), forced - min(forced, len(new))
            new = new[skip:]
            if not new:
                continue
            ids += new
            text_now = engine.tokenizer.decode(ids).lstrip()
            if text_now.endswith("\ufffd"):  # an incomplete UTF-8 sequence: wait for more bytes
                continue
            delta, sent = text_now[len(sent) :], text_now
            yield Chunk(text=delta, token_ids=new)
        result = engine.result(src, done.result(), opts)
        if result.text != sent:  # beam search, or text held back at the end
            tail = result.text[len(sent) :] if result.text.startswith(sent) else result.text
            yield Chunk(text=tail, token_ids=[] if ids == result.token_ids else result.token_ids)
        yield result
    finally:
        # Every exit, a client's cancel while waiting included: nothing of this call stays pending.
        if getter is not None:
            getter.cancel()
        done.cancel()


async def _submit(
    engine: Engine,
    text: str,
    opts: TranslateOptions,
    timeout: float | None,
    inference: Inference,
    pair: LanguagePair,
) -> tuple[
    documents.Plan, list[list[int]], list[tuple[Sentence, asyncio.Queue[list[int]]]], float, glossary.TermPlan | None
]:
    """Validate, split and queue the text's rows, each with a callback that puts the tokens of each
        of its decoder steps on a queue of its own; (the plan, the rows' source ids, each row's
        sentence and queue, the time.perf_counter() at submission, from which the time to the first
        chunk counts, and the glossary's matches, forced on the rows by the single-pass rule: a row
    streams from one pass, not the two of service.engine.placement)."""
    try:
        terms = engine.request_terms(opts)
        prefixes = engine.languages.prefixes(pair)
        size = engine.check_sizes([text], "text", [opts.target_prefix], "target_prefix")
        (plan,), src, sentences, found = await engine.work.run(
            lambda point: engine.prepare([text], opts, pair, prefixes, "", point, field="text", terms=terms),
            size,
            timeout,
        )
        engine.trace(engine.translation_model, sentences)
    except BaseException:
        inference.failed()
        raise
    loop = asyncio.get_running_loop()
    rows = []
    for sentence in sentences:
        steps: asyncio.Queue[list[int]] = asyncio.Queue()

        def on_tokens(toks: list[int], steps: asyncio.Queue[list[int]] = steps) -> None:  # a decode worker's thread
            loop.call_soon_threadsafe(steps.put_nowait, list(toks))

        sentence.on_tokens = on_tokens
        rows.append((sentence, steps))
    start = time.perf_counter()
    inference.submit()
    try:
        engine.scheduler.submit(sentences)  # all the rows, or none
    except BaseException:
        inference.failed()
        raise
    engine.count_texts([plan])
    return plan, src, rows, start, found
