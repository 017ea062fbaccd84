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


def corpus_rates(refs: list[str], hyps: list[str]) -> dict:
    """Corpus CER and WER computed by jiwer on the whole normalised lists at once."""
    r = [normalize(x) for x in refs]
    h = [normalize(x) for x in hyps]
    keep = [i for i, x in enumerate(r) if x]  # jiwer refuses empty references
    if not keep:
        return {"cer": 0.0, "wer": 0.0}
    rr, hh = [r[i] for i in keep], [h[i] for i in keep]
    return {"cer": jiwer.cer([x.replace(" ", "") for x in rr], [x.replace(" ", "") for x in hh]),
            "wer": jiwer.wer(rr, hh)}
