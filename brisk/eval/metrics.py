"""CER and WER with jiwer, after one stated text normalisation.

normalize(text), applied to references and hypotheses alike:
  1. Unicode NFKC: full-width letters, digits and punctuation become half-width (ＡＢＣ１２３ -> ABC123,
     ，-> ,), compatibility forms are unfolded;
  2. lowercase (str.lower);
  3. every character whose Unicode category is punctuation (P*) or symbol (S*) becomes a space
     (FunASR's text_tn likewise drops everything but word characters and spaces);
  4. runs of whitespace become one space; leading and trailing spaces are removed.
WER compares the space-separated words of that text. CER compares its characters with all spaces removed,
so Chinese (written without spaces) and English are scored alike and a space is never an error.
Corpus CER/WER = total edits (substitutions + deletions + insertions) / total reference characters (words).

Empty references (nothing left after normalisation) are kept, not dropped: such an utterance has no
characters to get wrong, so every character (word) of its hypothesis is an insertion, added to the edits
while adding nothing to the reference length. A set whose references are all empty has a rate of 0 when
the hypotheses are empty too, and of infinity otherwise. `brisk eval` flags such utterances (``empty_ref``)
and says how many there are.
"""

from __future__ import annotations

import unicodedata
from dataclasses import dataclass

import jiwer


def normalize(text: str) -> str:
    text = unicodedata.normalize("NFKC", text).lower()
    text = "".join(" " if unicodedata.category(c)[0] in "PS" else c for c in text)
    return " ".join(text.split())


def chars(text: str) -> str:
    """The CER view of a normalised text: its characters, spaces removed, separated by spaces for jiwer."""
    return " ".join(text.replace(" ", ""))


@dataclass
class Errors:
    words: int  # reference words
    word_errors: int  # S + D + I over words
    chars: int  # reference characters (no spaces)
    char_errors: int  # S + D + I over characters


def _edits(ref: str, hyp: str) -> tuple[int, int]:
    """(reference length, S + D + I) of two space-separated token strings; empty strings allowed."""
    n = len(ref.split())
    if n == 0:
        return 0, len(hyp.split())
    if not hyp.split():
        return n, n
    o = jiwer.process_words(ref, hyp)
    return n, o.substitutions + o.deletions + o.insertions


def errors(ref: str, hyp: str) -> Errors:
    r, h = normalize(ref), normalize(hyp)
    nw, ew = _edits(r, h)
    nc, ec = _edits(chars(r), chars(h))
    return Errors(nw, ew, nc, ec)


def rate(edits: int, length: int) -> float:
    """edits / length; over an empty reference: 0 without edits, infinity with some."""
    return edits / length if length else (0.0 if edits == 0 else float("inf"))


def corpus_rates(refs: list[str], hyps: list[str]) -> dict:
    """Corpus CER and WER over every utterance, empty references included (their hypotheses are insertions);
    for the non-empty ones alone this is jiwer's corpus CER/WER of the whole normalised lists."""
    es = [errors(r, h) for r, h in zip(refs, hyps)]
    return {"cer": rate(sum(e.char_errors for e in es), sum(e.chars for e in es)),
            "wer": rate(sum(e.word_errors for e in es), sum(e.words for e in es)),
            "empty_refs": sum(e.chars == 0 for e in es)}
