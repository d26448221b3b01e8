"""How a request's decoding options become a search, for one model version: the beam and length
penalty (`mode`), the n-best and sampling options checked against them (`check`), the requested
target prefixes as token ids (`output_prefixes`), each text's sampling generator (`sampling`) and
the cap on generated tokens (`cap`), and how many rows one request may queue (`max_request_rows`).
Every refusal is INVALID_ARGUMENT naming the option."""

from __future__ import annotations

import math
import time

from contract.manifest import Manifest
from service.batching.jobs import Sentence, new_request
from service.decoding.output_rules import max_output_len
from service.decoding.sampling import Sampling, sampling_rng
from service.engine import work
from service.engine.languages import Prefixes
from service.engine.requests import TranslateOptions
from service.engine.text import normalize_text
from service.engine.work import NO_CHECK, Checkpoint
from service.errors import DeadlineExceeded, InvalidArgument
from service.runtime.tokenizer import TextTokenizer
from service.settings import Settings


def samples(opts: TranslateOptions) -> bool:
    """Whether `opts` ask for random sampling rather than greedy or beam search."""
    return opts.sampling_topk > 1 or (opts.sampling_topp is not None and opts.sampling_topp < 1.0)


class SearchOptions:
    """The search options of one model version's requests (module doc)."""

    def __init__(self, settings: Settings, manifest: Manifest, tokenizer: TextTokenizer):
        self.settings, self.manifest, self.tokenizer = settings, manifest, tokenizer

    def mode(self, opts: TranslateOptions) -> tuple[int, float]:
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
        cap = self.cap(opts)
        if not 0 <= opts.min_output_tokens < cap:
            raise InvalidArgument(
                "options.min_output_tokens",
                f"{opts.min_output_tokens} is outside 0..{cap - 1} (below the cap of {cap} generated tokens, "
                "which counts the final </s>)",
            )
        self.check(opts, beam)
        return beam, float(lp)

    def check(self, opts: TranslateOptions, beam: int) -> None:
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

    def output_prefixes(
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
    def sampling(opts: TranslateOptions, n: int) -> list[Sampling | None]:
        """How each of `n` texts samples (None each unless `opts` sample): text i draws from a
        generator of its own, derived from the seed and i."""
        if not samples(opts):
            return [None] * n
        topp = 1.0 if opts.sampling_topp is None else float(opts.sampling_topp)
        temperature = 1.0 if opts.sampling_temperature is None else float(opts.sampling_temperature)
        topk = opts.sampling_topk if opts.sampling_topk > 1 else 0
        return [Sampling(topk, topp, temperature, sampling_rng(opts.seed, i)) for i in range(n)]

    def cap(self, opts: TranslateOptions) -> int:
        """Generated tokens a sentence may have at most, </s> included: the request's
        max_output_tokens, else the server's, within the position table."""
        cap = opts.max_output_tokens or self.settings.max_output_tokens
        return min(cap, self.manifest.dims.max_positions - 1)

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
        beam, lp = self.mode(opts)
        gen = self.manifest.generation
        cap = self.cap(opts)
        forced = list(prefixes.target)
        room = self.manifest.dims.max_positions - 1 - len(forced)  # the position table's room left
        kept = self.output_prefixes(opts, len(src), min(cap, room), field_prefix, point)
        sampling = self.sampling(opts, len(src))
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
