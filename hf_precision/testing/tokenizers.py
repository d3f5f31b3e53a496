"""Handmade tokenizers for the tiny pipelines, built offline from a handful of pieces (no Hub download).

One per tokenizer kind a shipped pipeline uses: CLIP BPE, T5 Unigram, Gemma, Qwen2 byte-level BPE, BERT WordPiece and
Llama BPE. Vocabularies are small; the tiny text encoders' ``vocab_size`` is at least as large::

    >>> make_tokenizer()("a cat").input_ids  # <|startoftext|> a</w> cat</w> <|endoftext|>
    [0, 28, 71, 1]
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

__all__ = ["CLIP_VOCAB_MERGES", "make_bert_tokenizer", "make_gemma_tokenizer", "make_llama_chat_tokenizer",
           "make_llama_tokenizer",
           "make_qwen2_tokenizer", "make_t5_tokenizer", "make_tokenizer"]

# Handmade CLIP BPE: <|startoftext|>, <|endoftext|>, a-z, a-z</w>, digits, punctuation, a few merges.
_LETTERS = "abcdefghijklmnopqrstuvwxyz"
_PUNCTUATION = ".,!?'-"
_MERGES = ["a t</w>", "c at</w>", "t h", "th e</w>", "d o", "do g</w>"]
CLIP_VOCAB_MERGES: dict[str, Any] = {
    "vocab": (
        ["<|startoftext|>", "<|endoftext|>"]
        + list(_LETTERS)
        + [c + "</w>" for c in _LETTERS]
        + list("0123456789")
        + list(_PUNCTUATION)
        + [m.replace(" ", "") for m in _MERGES]
    ),
    "merges": _MERGES,
}


def make_tokenizer(folder: str | Path | None = None):
    """A handmade CLIP BPE tokenizer (76 tokens, ``model_max_length=77``), built offline.

    ``vocab.json`` and ``merges.txt`` are written to ``folder`` (a temporary directory when None) and
    loaded with ``CLIPTokenizer.from_pretrained``. Unknown characters map to ``<|endoftext|>``.

    >>> tok = make_tokenizer()
    >>> tok("a cat").input_ids  # <|startoftext|> a</w> cat</w> <|endoftext|>
    [0, 28, 71, 1]
    """
    from transformers import CLIPTokenizer

    vocab = {token: i for i, token in enumerate(CLIP_VOCAB_MERGES["vocab"])}
    merges = "#version: 0.2\n" + "\n".join(CLIP_VOCAB_MERGES["merges"]) + "\n"

    def _write_and_load(path: Path):
        path.mkdir(parents=True, exist_ok=True)
        (path / "vocab.json").write_text(json.dumps(vocab), encoding="utf-8")
        (path / "merges.txt").write_text(merges, encoding="utf-8")
        return CLIPTokenizer.from_pretrained(str(path), model_max_length=77)

    if folder is not None:
        return _write_and_load(Path(folder))
    with tempfile.TemporaryDirectory(prefix="hf_precision_tok_") as tmp:
        return _write_and_load(Path(tmp))


def make_t5_tokenizer():
    """A handmade T5 tokenizer (Unigram over single characters and a few words), built offline.

    No sentencepiece model is needed: transformers 5 builds ``T5Tokenizer`` from a list of
    ``(piece, score)`` pairs. Ids: ``<pad>=0, </s>=1, <unk>=2``; 10 ``<extra_id_*>`` sentinels.

    >>> make_t5_tokenizer()("a cat").input_ids[-1]
    1
    """
    from transformers import T5Tokenizer

    pieces = [("<pad>", 0.0), ("</s>", 0.0), ("<unk>", 0.0), ("\u2581", -2.0)]
    pieces += [(c, -5.0) for c in _LETTERS + "0123456789" + _PUNCTUATION]
    pieces += [("\u2581" + c, -4.0) for c in _LETTERS]
    pieces += [(w, -1.0) for w in ("\u2581a", "\u2581cat", "\u2581dog", "\u2581the", "\u2581photo", "\u2581of")]
    first: dict[str, float] = {}
    for piece, score in pieces:  # a piece listed twice keeps its first score
        first.setdefault(piece, score)
    vocab = list(first.items())
    extra_ids = 10
    vocab += [(f"<extra_id_{i}>", 0.0) for i in range(extra_ids - 1, -1, -1)]
    return T5Tokenizer(vocab=vocab, extra_ids=extra_ids, model_max_length=512)


_WORDS = ("a", "cat", "dog", "the", "photo", "of", "red", "blue")


def make_gemma_tokenizer():
    """A handmade Gemma tokenizer (byte-fallback BPE over single characters), built offline.

    >>> tok = make_gemma_tokenizer()
    >>> tok.pad_token_id, len(tok("a cat").input_ids) > 2
    (0, True)
    """
    from transformers import GemmaTokenizer

    specials = ["<pad>", "<eos>", "<bos>", "<unk>", "<mask>", "<start_of_turn>", "<end_of_turn>"]
    chars = sorted(set("abcdefghijklmnopqrstuvwxyz0123456789.,!?'-:\n") | {"\u2581"})
    vocab = {t: i for i, t in enumerate(specials + chars)}
    return GemmaTokenizer(vocab=vocab, merges=[], model_max_length=300)


_QWEN_SPECIALS = ["<|im_start|>", "<|im_end|>", "<|vision_start|>", "<|vision_end|>", "<|image_pad|>"]


def _add_word_merges(pieces: list[str], vocab: dict[str, int], merges: list[tuple[str, str]]) -> None:
    """Append the merge chain that makes each of ``pieces`` one token (and its prefixes' tokens), once each."""
    known = set(merges)
    for piece in pieces:
        for i in range(1, len(piece)):
            if (piece[:i], piece[i]) not in known:
                known.add((piece[:i], piece[i]))
                merges.append((piece[:i], piece[i]))
                vocab.setdefault(piece[:i + 1], len(vocab))


def make_qwen2_tokenizer():
    """A handmade Qwen2 tokenizer: byte-level BPE with the 256 bytes and Qwen's chat special tokens, built offline.

    >>> tok = make_qwen2_tokenizer()
    >>> tok.decode(tok("a cat").input_ids)
    'a cat'
    """
    return make_qwen2_words_tokenizer("")


def make_bert_tokenizer():
    """A handmade BERT WordPiece tokenizer (a few words and single characters), built offline.

    >>> make_bert_tokenizer()("a cat").input_ids
    [2, 5, 6, 3]
    """
    from transformers import BertTokenizer

    tokens = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *_WORDS, *"abcdefghijklmnopqrstuvwxyz0123456789"]
    tokens += [f"##{c}" for c in "abcdefghijklmnopqrstuvwxyz0123456789"]
    vocab = {t: i for i, t in enumerate(dict.fromkeys(tokens))}
    return BertTokenizer(vocab=vocab, model_max_length=77)


def make_llama_tokenizer():
    """A handmade byte-free Llama BPE tokenizer (letters, digits, a few words), built offline.

    >>> tok = make_llama_tokenizer()
    >>> tok.convert_ids_to_tokens(tok("a cat").input_ids)
    ['\u2581a', '\u2581c', 'a', 't']
    """
    from transformers import LlamaTokenizer

    vocab, merges = _llama_pieces()
    tokenizer = LlamaTokenizer(vocab=vocab, merges=merges, pad_token="<pad>")
    tokenizer.model_max_length = 256
    return tokenizer


def _llama_pieces() -> tuple[dict[str, int], list[tuple[str, str]]]:
    letters = "abcdefghijklmnopqrstuvwxyz0123456789.,!?'-:;()"
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, "<pad>": 3, "\u2581": 4}
    for c in letters + letters.upper():
        vocab.setdefault(c, len(vocab))
        vocab.setdefault("\u2581" + c, len(vocab))
    return vocab, [("\u2581", c) for c in letters + letters.upper()]


def make_llama_chat_tokenizer(template: str):
    """A handmade Llama BPE tokenizer that reads a chat ``template`` in about as many tokens as a real one.

    Pipelines that cut a prompt template's encoding at fixed token positions (HunyuanVideo I2V: ``crop_start`` 103,
    the ``<image>`` token at position 5, the ``<|end_header_id|>`` markers) need what a character-level tokenizer
    lacks: the template's ``<...>`` markers as single special tokens, its words and ``"\\n\\n"`` as single tokens (a
    merge chain each), a BOS token, and a word-start mark after every special token (``legacy``), so the words
    there are whole too. Other text still falls back to single characters.

    >>> tok = make_llama_chat_tokenizer("<|h|>system<|e|>\\n\\n<image>\\nDescribe the video")
    >>> tok.convert_ids_to_tokens(tok("<|h|>system<|e|>\\n\\n<image>\\nDescribe the cat").input_ids)[:9]
    ['<s>', '<|h|>', '\u2581system', '<|e|>', '\u2581\\n\\n', '<image>', '\u2581\\n', 'Describe', '\u2581the']
    """
    import re

    from transformers import LlamaTokenizer

    vocab, merges = _llama_pieces()
    vocab.setdefault("\n", len(vocab))
    specials = list(dict.fromkeys(re.findall(r"<[^<>\s]+>", template)))
    for special in specials:
        template = template.replace(special, " ")
    words = sorted(set(re.findall(r"[A-Za-z]+", template)))
    # word-start chains first, so they win over the bare chains (a word right after a newline) inside a word
    pieces = ["\u2581" + w for w in words + ["\n\n"]] + words
    _add_word_merges(pieces, vocab, merges)
    tokenizer = LlamaTokenizer(vocab=vocab, merges=merges, pad_token="<pad>", legacy=True, add_bos_token=True)
    tokenizer.add_special_tokens({"additional_special_tokens": specials})
    tokenizer.model_max_length = 1024
    return tokenizer


def make_qwen2_words_tokenizer(text: str):
    """The handmade Qwen2 byte-level BPE with merges that make each word of ``text`` one token (with or without a
    leading space), for pipelines that cut a prompt template's encoding at a fixed token position: the template
    then takes about as many tokens as with Qwen's own tokenizer. Other text still falls back to single bytes.

    >>> tok = make_qwen2_words_tokenizer("Describe the video in detail.")
    >>> tok.convert_ids_to_tokens(tok("Describe the video, a cat").input_ids)
    ['Describe', '\u0120the', '\u0120video', ',', '\u0120', 'a', '\u0120', 'c', 'a', 't']
    """
    import re

    from transformers import Qwen2Tokenizer
    from transformers.convert_slow_tokenizer import bytes_to_unicode  # GPT-2's byte -> printable character table

    vocab = {c: i for i, c in enumerate(bytes_to_unicode().values())}
    merges: list[tuple[str, str]] = []
    words = sorted(set(re.findall(r"[A-Za-z]+", text)))
    _add_word_merges(["\u0120" + w for w in words] + words, vocab, merges)  # "\u0120": byte-level leading space
    tok = Qwen2Tokenizer(vocab=vocab, merges=merges, model_max_length=1024)
    tok.add_special_tokens({"additional_special_tokens": _QWEN_SPECIALS})
    return tok
