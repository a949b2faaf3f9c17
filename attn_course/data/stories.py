"""Little stories from a small grammar, in which other words of the sentence decide a blank.

Chapter 08 trains a small BERT to fill in blanks. In nursery rhymes few blanks are decided by the
rest of the rhyme, and a couple of thousand words cannot teach what is; these sentences are made so
that many are, through words that are *not* next to the blank::

    anna met ben in the old park and ben gave anna a cake so anna thanked ben for the cake
    the small dogs that emma saw in the garden bark

- **repeated names and objects** (first kind): after "and", "gave", "so", "thanked" and "for the"
  come the two names and the object of the first half, in a fixed order: only the first half says
  which of the 8 names and 4 objects they are;
- **agreement and facts** (second kind): each animal makes its own sound (dogs bark, cats purr,
  birds sing, cows moo), and the verb agrees with the noun in number ("the dog ... barks", "the dogs
  ... bark"): the verb at the end decides the noun, seven words or more back, and the other way round.

The places, the adjectives, the first name and the first mention of the object are drawn at random:
there nothing in the sentence decides the blank, and no model can do better than guess.

- :func:`make_story`: one story from a ``random.Random``;
- :func:`story_splits`: distinct stories for training, validation and test, no story in two of them.
"""

from __future__ import annotations

import random

from attn_course import _validate

__all__ = ["NAMES", "ANIMALS", "ANIMAL_ADJECTIVES", "PLACES", "ADJECTIVES", "OBJECTS", "make_story", "story_splits"]

NAMES = ("anna", "ben", "clara", "dan", "emma", "finn", "grace", "hugo")
#: singular noun -> (plural noun, verb after a singular noun, verb after a plural noun)
ANIMALS = {"dog": ("dogs", "barks", "bark"), "cat": ("cats", "purrs", "purr"),
           "bird": ("birds", "sings", "sing"), "cow": ("cows", "moos", "moo")}
ANIMAL_ADJECTIVES = ("small", "brown", "white", "young")
PLACES = ("park", "garden", "field", "yard")
ADJECTIVES = ("big", "old", "green", "quiet")
OBJECTS = ("book", "apple", "ball", "cake")


def make_story(rng: random.Random) -> str:
    """One story, of either kind with probability 1/2, drawn with ``rng``.

    Args:
        rng: a ``random.Random`` (the same seed always gives the same stories).

    Returns:
        The story, lower-case words separated by single spaces, without punctuation.

    Raises:
        TypeError: ``rng`` not a ``random.Random``.

    Example:
        >>> make_story(random.Random(0))
        'hugo met dan in the yard and dan gave hugo a ball so hugo thanked dan for the ball'
    """
    if not isinstance(rng, random.Random):
        raise TypeError(f"make_story: rng must be a random.Random, got {type(rng).__name__}")
    place = "the " + (rng.choice(ADJECTIVES) + " " if rng.random() < 0.5 else "") + rng.choice(PLACES)
    if rng.random() < 0.5:
        first, second = rng.sample(NAMES, 2)
        thing = rng.choice(OBJECTS)
        return (f"{first} met {second} in {place} and {second} gave {first} a {thing} "
                f"so {first} thanked {second} for the {thing}")
    animal = rng.choice(sorted(ANIMALS))
    plural, verb_one, verb_many = ANIMALS[animal]
    many = rng.random() < 0.5
    looks = rng.choice(ANIMAL_ADJECTIVES) + " " if rng.random() < 0.5 else ""
    noun, verb = (plural, verb_many) if many else (animal, verb_one)
    return f"the {looks}{noun} that {rng.choice(NAMES)} saw in {place} {verb}"


def story_splits(train: int = 2000, validation: int = 200, test: int = 200,
                 seed: int = 0) -> tuple[list[str], list[str], list[str]]:
    """Distinct stories for training, for choosing a checkpoint (validation), and for the final report (test).

    Stories are drawn with ``random.Random(seed)``, a repeat of an earlier one is skipped, and the
    first ``train`` go to training, the next ``validation`` to validation, the last ``test`` to
    test: no story is in two splits.

    Args:
        train, validation, test: how many stories each split holds (at least 1 each; together at
            most 4,000, well below the 10,880 different stories the grammar can make).
        seed: the seed of the draws.

    Returns:
        ``(train_stories, validation_stories, test_stories)``, three lists of str.

    Raises:
        TypeError: counts or seed not int. ValueError: a count below 1, more than 4,000 in all,
            or a negative seed.

    Example:
        >>> train, validation, test = story_splits(3, 1, 1)
        >>> len(set(train + validation + test))
        5
    """
    where = "story_splits"
    sizes = [_validate.integer(where, name, value, minimum=1)
             for name, value in (("train", train), ("validation", validation), ("test", test))]
    seed = _validate.integer(where, "seed", seed, minimum=0)
    if sum(sizes) > 4_000:
        raise ValueError(f"{where}: at most 4,000 stories in all, got {sum(sizes)}")
    rng, seen, stories = random.Random(seed), set(), []
    while len(stories) < sum(sizes):
        story = make_story(rng)
        if story not in seen:
            seen.add(story)
            stories.append(story)
    return stories[:sizes[0]], stories[sizes[0]:sizes[0] + sizes[1]], stories[sizes[0] + sizes[1]:]
