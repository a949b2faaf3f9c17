"""The course's text corpora: traditional (public-domain) English nursery rhymes, shipped as ``.txt`` files.

- :func:`load_rhymes`: the training text of chapters 04 and 08 (~6 KB);
- :func:`load_more_rhymes`: other rhymes, none of them in the first text (~6.5 KB), for held-out tests;
- :func:`held_out_split`: a text cut at a blank line into a part to train on and a part held out;
- :func:`load_pretraining_text`, :func:`split_rhymes`: chapter 08's BERT corpus (both files), rhyme by rhyme.
"""

from __future__ import annotations

from importlib import resources

from attn_course import _validate

__all__ = ["load_rhymes", "load_more_rhymes", "held_out_split", "load_pretraining_text", "split_rhymes"]


def load_rhymes() -> str:
    """The course's training text: traditional (public-domain) English nursery rhymes, ~6 KB."""
    return resources.files("attn_course.data").joinpath("nursery_rhymes.txt").read_text(encoding="utf-8")


def held_out_split(text: str, fraction: float = 0.1) -> tuple[str, str]:
    """Split ``text`` into a part to train on and the last ``fraction`` of it, held out.

    The cut moves back to the nearest blank line before it, so that no rhyme (or paragraph)
    is split between the two parts; without a blank line it falls exactly at the fraction.

    Args:
        text: the whole text.
        fraction: the share of characters to hold out, in ``[0, 1)``; 0 holds out nothing.

    Returns:
        ``(train_text, held_out_text)``, which concatenate to ``text``.

    Raises:
        TypeError: ``text`` not a str, or ``fraction`` not a number.
        ValueError: ``fraction`` outside ``[0, 1)``.

    Example:
        >>> held_out_split("one two\\n\\nthree four\\n\\nfive", fraction=0.1)
        ('one two\\n\\nthree four\\n\\n', 'five')
    """
    where = "held_out_split"
    if not isinstance(text, str):
        raise TypeError(f"{where}: text must be a str, got {type(text).__name__}")
    fraction = _validate.dropout(where, fraction, name="fraction")
    if fraction == 0:
        return text, ""
    cut = round(len(text) * (1 - fraction))
    blank_line = text.rfind("\n\n", 0, cut)
    if blank_line > 0:
        cut = blank_line + 2
    return text[:cut], text[cut:]


def load_more_rhymes() -> str:
    """Other traditional nursery rhymes (~6.5 KB), none of them in :func:`~attn_course.data.rhymes.load_rhymes`."""
    return resources.files("attn_course.data").joinpath("more_nursery_rhymes.txt").read_text(encoding="utf-8")


def load_pretraining_text() -> str:
    """The text the small BERT is trained on: chapter 04's rhymes, then more traditional rhymes.

    Both files hold traditional English nursery rhymes, public domain (collected in print since the
    18th and 19th centuries; "Three Little Kittens" is Eliza Lee Follen's, 1843, and "The Owl and
    the Pussy-cat" Edward Lear's, 1871). Rhymes are separated by a blank line; about 14 KB.

    Returns:
        The text of ``data/nursery_rhymes.txt`` and ``data/more_nursery_rhymes.txt``, joined by a
        blank line.
    """
    return load_rhymes().rstrip("\n") + "\n\n" + load_more_rhymes()


def split_rhymes(text: str, held_out_fraction: float = 0.1) -> tuple[list[str], list[str]]:
    """Split a text into rhymes (blank-line separated) to train on and rhymes held out.

    The last ``held_out_fraction`` of the characters, moved back to a blank line
    (:func:`held_out_split`), is held out, so a rhyme is wholly on
    one side.

    Args:
        text: rhymes separated by blank lines.
        held_out_fraction: in ``[0, 1)``.

    Returns:
        ``(train_rhymes, held_out_rhymes)``: two lists of non-empty strings.

    Raises:
        TypeError: ``text`` not a str. ValueError: ``held_out_fraction`` outside ``[0, 1)``.

    Example:
        >>> split_rhymes("a b\\n\\nc d\\n\\ne f", held_out_fraction=0.2)
        (['a b', 'c d'], ['e f'])
    """
    train, held_out = held_out_split(text, held_out_fraction)

    def rhymes(part: str) -> list[str]:
        return [r.strip() for r in part.split("\n\n") if r.strip()]

    return rhymes(train), rhymes(held_out)
