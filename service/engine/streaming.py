"""TranslateStream: one text, its translation sent as chunks of text as the decoder emits tokens,
then the full result. The engine validates and tokenises; this module follows the sentence's
decoder steps and turns them into chunks."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

from service.batching.jobs import Sentence
from service.engine.inference import Inference
from service.engine.languages import LanguagePair
from service.engine.requests import Chunk, TranslateOptions, TranslationResult

if TYPE_CHECKING:
    from service.engine.engine import Engine


async def translate_stream(
    engine: Engine, text: str, opts: TranslateOptions, timeout: float | None = None, pair: LanguagePair = LanguagePair()
) -> AsyncIterator[Chunk | TranslationResult]:
    """Chunks of the translation of `text` as they are decoded, then its TranslationResult (with
    a last chunk first when the result's text is not what the chunks added up to). A chunk holds
    whole characters only: text that ends in an incomplete UTF-8 sequence waits for the next token.
    The forced target language token of a multilingual model is no part of the translation."""
    inference = Inference(engine.metrics, engine.translation_model)
    src, sentence, steps, start = _submit(engine, text, opts, timeout, inference, pair)
    forced = len(sentence.target_prefix)  # the first tokens emitted, never shown
    done = asyncio.wrap_future(sentence.future)
    ids: list[int] = []
    sent = ""
    first = True
    try:
        while True:
            getter = asyncio.ensure_future(steps.get())
            await asyncio.wait({getter, done}, return_when=asyncio.FIRST_COMPLETED)
            if getter.done():
                new = [t for t in getter.result() if t != engine.eos_id]
                skip, forced = min(forced, len(new)), forced - min(forced, len(new))
                new = new[skip:]
            else:
                getter.cancel()
                break
            if not new:
                continue
            ids += new
            text_now = engine.tokenizer.decode(ids).lstrip()
            if text_now.endswith("\ufffd"):  # an incomplete UTF-8 sequence: wait for more bytes
                continue
            delta, sent = text_now[len(sent) :], text_now
            if first:
                engine.metrics.time_to_first_chunk.observe(time.perf_counter() - start)
                first = False
            yield Chunk(text=delta, token_ids=new)
        finished = done.result()
        inference.compute_done([sentence])
        result = engine.result(src[0], finished, opts)
        if result.text != sent:  # beam search, or text held back at the end
            if first:
                engine.metrics.time_to_first_chunk.observe(time.perf_counter() - start)
            tail = result.text[len(sent) :] if result.text.startswith(sent) else result.text
            yield Chunk(text=tail, token_ids=[] if ids == result.token_ids else result.token_ids)
        inference.succeeded(1)
        yield result
    except BaseException:
        inference.failed()  # no-op once succeeded: the client may go away after the result
        raise
    finally:
        done.cancel()


def _submit(
    engine: Engine,
    text: str,
    opts: TranslateOptions,
    timeout: float | None,
    inference: Inference,
    pair: LanguagePair,
) -> tuple[list[list[int]], Sentence, asyncio.Queue[list[int]], float]:
    """Validate and queue the text's sentence with a callback that puts the tokens of each of its
    decoder steps on the returned queue; (source ids, the sentence, that queue, the
    time.perf_counter() at submission, from which the time to the first chunk counts)."""
    try:
        prefixes = engine.languages.prefixes(pair)
        src = engine.source_ids([text], field="text", prefixes=prefixes)
        (sentence,) = engine.sentences(src, opts, timeout, prefixes)
        engine.trace(engine.translation_model, [sentence])
    except BaseException:
        inference.failed()
        raise
    loop = asyncio.get_running_loop()
    steps: asyncio.Queue[list[int]] = asyncio.Queue()

    def on_tokens(toks: list[int]) -> None:  # called from a decode worker's thread
        loop.call_soon_threadsafe(steps.put_nowait, list(toks))

    sentence.on_tokens = on_tokens
    start = time.perf_counter()
    inference.submit()
    try:
        engine.scheduler.submit([sentence])
    except BaseException:
        inference.failed()
        raise
    return src, sentence, steps, start
