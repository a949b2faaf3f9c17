"""Tests for attn_course.teaching.source.show_source."""

from __future__ import annotations

from pathlib import Path

import pytest

import attn_course.core.attention
from attn_course import show_source
from attn_course.core.attention import self_attention
from attn_course.core.masks import causal_mask
from attn_course.data.toy_sentence import ToySentence
from attn_course.positions.rope import RotaryEmbedding

ATTENTION_FILE = Path(attn_course.core.attention.__file__).read_text()


def test_repr_is_the_plain_source_under_a_title():
    text = repr(show_source(self_attention))
    title, _, code = text.partition("\n")
    assert title == "# attn_course.core.attention.self_attention"
    assert code.startswith("def self_attention(")
    assert code in ATTENTION_FILE                       # the real file's text, verbatim


def test_markdown_is_a_python_code_block():
    markdown = show_source(self_attention)._repr_markdown_()
    assert markdown.startswith("`attn_course.core.attention.self_attention`")
    assert "```python\ndef self_attention(" in markdown
    assert markdown.rstrip().endswith("```")


def test_shows_classes_methods_and_modules():
    assert "class ToySentence" in repr(show_source(ToySentence))
    assert "def index(self, token: str)" in repr(show_source(ToySentence.index))
    module = repr(show_source(attn_course.core.masks))
    assert module.startswith("# attn_course.core.masks\n")
    assert "def causal_mask(" in module and "def padding_mask(" in module


def test_source_of_one_function_excludes_its_neighbours():
    code = repr(show_source(causal_mask))
    assert "def causal_mask(" in code
    assert "def padding_mask(" not in code


@pytest.mark.parametrize("obj", [3, len, None], ids=repr)
def test_objects_without_python_source_raise_type_error(obj):
    with pytest.raises(TypeError, match="show_source: obj must be a Python function"):
        show_source(obj)


@pytest.mark.parametrize("name", ["self_attention", "attn_course.core.attention.no_such_function",
                                  "attn_course.no_such_module.f", "attn_course.core.attention.MAX.x"])
def test_a_name_of_no_function_or_class_raises_value_error(name):
    with pytest.raises(ValueError, match=f"show_source: obj={name!r} names no function or class"):
        show_source(name)


@pytest.mark.parametrize("obj, name", [(self_attention, "attn_course.core.attention.self_attention"),
                                       (ToySentence, "attn_course.data.toy_sentence.ToySentence"),
                                       (RotaryEmbedding.rotate, "attn_course.positions.rope.RotaryEmbedding.rotate")])
def test_a_dotted_name_shows_what_the_object_shows(obj, name):
    assert repr(show_source(name)) == repr(show_source(obj))
    assert repr(show_source(name, docstring=False, start="def")) == repr(show_source(obj, docstring=False, start="def"))


def test_shows_a_triton_kernel_with_its_decorator():
    pytest.importorskip("triton")
    from attn_course.flash import kernels

    text = repr(show_source(kernels.attention_forward_kernel))
    assert text.splitlines()[0] == "# attn_course.flash.kernels.attention_forward_kernel"
    assert "@triton.jit" in text and "def attention_forward_kernel(" in text and "forward_key_tiles(" in text
    loop = repr(show_source(kernels.forward_key_tiles))        # the key loop the kernel calls, twice
    assert "@triton.jit" in loop and "def forward_key_tiles(" in loop and "tl.dot(q, k_t)" in loop
    assert "def attention_forward_kernel(" not in loop
    # By name, read from the file without importing it: what a machine without Triton shows.
    assert repr(show_source("attn_course.flash.kernels.attention_forward_kernel")) == text


def test_without_docstrings_every_other_line_stays_verbatim_and_in_order():
    full = repr(show_source(ToySentence)).splitlines()[1:]
    bare = repr(show_source(ToySentence, docstring=False)).splitlines()[1:]
    assert '"""' not in "\n".join(bare)
    assert "    def index(self, token: str) -> int:" in bare
    # what is left is the full listing with the docstring lines removed, nothing rewritten
    remaining = iter(full)
    assert all(any(line == other for other in remaining) for line in bare)
    assert len(bare) < len(full) - 10


def test_without_docstrings_keeps_a_string_that_is_not_a_docstring():
    def function():
        x = 1
        "a string after a statement is not a docstring"
        return x
    assert "not a docstring" in repr(show_source(function, docstring=False))


def test_docstring_must_be_a_bool():
    with pytest.raises(TypeError, match="docstring must be True or False, got 'no'"):
        show_source(self_attention, docstring="no")


def test_an_excerpt_starts_and_stops_at_the_lines_named():
    from attn_course.flash.tiled import online_softmax

    text = repr(show_source(online_softmax, start="for start in range", stop="return torch.exp"))
    title, _, code = text.partition("\n")
    assert title == "# attn_course.flash.tiled.online_softmax (excerpt)"
    assert code.startswith("for start in range(")                          # dedented to column 0
    assert "_validate" not in code and "return torch.exp" not in code       # no input checks, stop excluded
    assert "merge_softmax_blocks(" in code
    assert code.replace("\n", "\n    ").strip() in Path(online_softmax.__code__.co_filename).read_text()
    assert repr(show_source(online_softmax, start="for start in range")).endswith("unsqueeze(-1)\n")


@pytest.mark.parametrize("kwargs, error", [({"start": "no such line"}, ValueError),
                                           ({"stop": "no such line"}, ValueError), ({"start": 3}, TypeError)])
def test_an_excerpt_that_names_no_line_is_refused(kwargs, error):
    with pytest.raises(error, match="show_source: (start|stop)"):
        show_source(self_attention, **kwargs)
