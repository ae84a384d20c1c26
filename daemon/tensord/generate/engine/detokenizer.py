"""Incremental detokenization and stop-string matching on the text it produces.

Byte-level BPE tokenizers split a multibyte UTF-8 character across tokens, and decoding
a lone piece of one gives U+FFFD. `IncrementalDetokenizer` follows the prefix and read
offsets of Text Generation Inference and vLLM: a short window of recent tokens is decoded
without and with the new ones, and the difference goes out only once the window no longer
ends in U+FFFD, so a character is never split between deltas. Decoding the window (not a
lone token) keeps what decoders do at token boundaries (leading spaces of SentencePiece's
"▁", merged byte tokens) exactly as a full decode would.

tokenizers' `DecodeStream` runs that algorithm in Rust, one call per token, and produces
it for every token here. Two cases it cannot produce the same text for, so they keep the
window step written out below (tests/unit/generate/test_detokenizer_reference.py checks
every delta against it, on four kinds of tokenizer):

- a prompt whose last tokens end inside a character (a prompt given as token ids): the
  stream takes no prefix that ends in U+FFFD, and would then emit the prompt's own text
  with the first output token;
- decoders with byte fallback (SentencePiece: Llama, Mistral, Gemma): when a character's
  byte tokens complete, the window's several U+FFFD become one character, its text is no
  longer an extension of the prefix, and the stream raises ("Invalid prefix"). The window
  step emits what follows the prefix's length, as before; the request goes on without the
  stream.

The stream also has no end: `flush` (the text still held back, an incomplete character
shown as U+FFFD) is the window step's, from the window and the tokens since, which
`IncrementalDetokenizer` keeps for that.

`StopStringMatcher` finds stop strings in that text, across deltas, and holds back the
end of the text while it could still be the start of a stop string, so a stop string is
never emitted.
"""

from __future__ import annotations

from collections.abc import Sequence

from tokenizers import Tokenizer
from tokenizers.decoders import DecodeStream

# Prompt tokens decoded before the first output token, as vLLM does, so the first
# delta starts the way a full decode of prompt and output would continue.
INITIAL_INCREMENTAL_DETOKENIZATION_OFFSET = 5
_REPLACEMENT = "\ufffd"


class IncrementalDetokenizer:
    """Turns one request's output tokens, as they come, into text deltas."""

    def __init__(
        self,
        tokenizer: Tokenizer,
        prompt_token_ids: Sequence[int],
        skip_special_tokens: bool = True,
    ) -> None:
        self.tokenizer = tokenizer
        self.skip_special_tokens = skip_special_tokens
        offset = INITIAL_INCREMENTAL_DETOKENIZATION_OFFSET
        self._window = list(prompt_token_ids[-offset:]) if offset else []
        """The tokens whose text went out last (at first, the prompt's last ones): the
        decoded prefix the next delta follows."""
        self._pending: list[int] = []
        """Tokens since, whose text is held back."""
        self._stream: DecodeStream | None = None
        if not self._decode(self._window).endswith(_REPLACEMENT):
            self._stream = DecodeStream(self._window, skip_special_tokens)

    def update(self, new_token_ids: Sequence[int]) -> str:
        """Add tokens; returns the text they complete (possibly empty)."""
        return "".join([self._next(token_id) for token_id in new_token_ids])

    def flush(self) -> str:
        """At the end: the text still held back (an incomplete character shows as U+FFFD,
        as a full decode would show it)."""
        return self._window_step(final=True)

    def _next(self, token_id: int) -> str:
        self._pending.append(token_id)
        if self._stream is None:
            return self._window_step(final=False)
        try:
            delta = self._stream.step(self.tokenizer, token_id)
        except Exception:  # "Invalid prefix" (see the module doc); a bad id raises again
            self._stream = None
            return self._window_step(final=False)
        if delta:
            self._window, self._pending = self._pending, []
        return delta or ""

    def _window_step(self, final: bool) -> str:
        prefix_text = self._decode(self._window)
        new_text = self._decode(self._window + self._pending)
        if len(new_text) <= len(prefix_text) or (not final and new_text.endswith(_REPLACEMENT)):
            return ""
        self._window, self._pending = self._pending, []
        return new_text[len(prefix_text) :]

    def _decode(self, ids: list[int]) -> str:
        if not ids:
            return ""
        return self.tokenizer.decode(ids, skip_special_tokens=self.skip_special_tokens)


class StopStringMatcher:
    """Finds the first stop string in a stream of text deltas; never lets one out."""

    def __init__(self, stops: Sequence[str]) -> None:
        if any(not stop for stop in stops):
            raise ValueError("stop strings must not be empty")
        self.stops = tuple(stops)
        self._held = ""

    def feed(self, delta: str) -> tuple[str, str | None]:
        """Add text; returns the text now safe to emit and the stop string matched, if any.

        After a match, the text from the stop string on is dropped."""
        text = self._held + delta
        match = self._first_match(text)
        if match is not None:
            start, stop = match
            self._held = ""
            return text[:start], stop
        keep = self._longest_stop_prefix_suffix(text)
        self._held = text[len(text) - keep :] if keep else ""
        return text[: len(text) - keep], None

    def flush(self) -> str:
        """At the end with no match: the held-back text, which turned out not to stop."""
        held, self._held = self._held, ""
        return held

    def _first_match(self, text: str) -> tuple[int, str] | None:
        best: tuple[int, str] | None = None
        for stop in self.stops:
            start = text.find(stop)
            if start >= 0 and (best is None or start < best[0]):
                best = (start, stop)
        return best

    def _longest_stop_prefix_suffix(self, text: str) -> int:
        """The length of the longest end of `text` that some stop string starts with."""
        longest = 0
        for stop in self.stops:
            for size in range(min(len(stop) - 1, len(text)), longest, -1):
                if text.endswith(stop[:size]):
                    longest = size
                    break
        return longest
