"""Tokenizers with one special-token layout for the whole toolbox: a character tokenizer and SentencePiece.

Special ids (every tokenizer, exactly): ``PAD_ID = 0``, ``EOS_ID = 1``, ``BOS_ID = 2`` as in Gemma
(google-deepmind/gemma), plus ``MASK_ID = 3``, the absorbing token of masking diffusion (MD4, Shi et al. 2024;
MDLM, Sahoo et al. 2024). Content tokens start at 4. SentencePiece (Kudo & Richardson 2018, google/sentencepiece)
is trained in-process on the training split only.

Deliberate choices and differences from the usual SentencePiece setup:
- ``<mask>`` is a SentencePiece *control* symbol, not a user-defined one: a literal ``"<mask>"`` in a text is
  encoded as ordinary characters, and only the model's own mask id is ever 3. SentencePiece's unknown piece is
  renamed ``<spm_unk>`` and sits at id 4 (first content id). The trainer drops occurrences of its meta pieces from
  the training text; with the default name ``<unk>`` that silently removes every ``<unk>`` word of PTB (and with
  it the characters ``<`` and ``>``), so PTB would not round-trip.
- No normalisation (``normalization_rule_name="identity"``), no removal of extra whitespace and no dummy prefix:
  ``decode(encode(s)) == s`` holds exactly for every text whose characters were seen in training (or every text
  with ``byte_fallback=True``), including leading/trailing spaces, and encoding concatenates cleanly.
- ``"\\n"`` is a user-defined piece, so multi-line documents (Shakespeare) are representable although training
  consumes single lines.
- Characters outside the vocabulary raise ``ValueError`` at encode time (both tokenizers) instead of silently
  becoming an unknown token; use ``byte_fallback=True`` for open-vocabulary SentencePiece models.
- ``decode`` never emits special tokens: PAD/BOS/MASK are skipped, and EOS either ends the text
  (``stop_at_eos=True``, the default) or is skipped.
"""

from __future__ import annotations

import abc
import dataclasses
import io
import json
import os
import pathlib
from collections.abc import Iterable, Sequence
from typing import Any, ClassVar

import numpy as np
import sentencepiece as spm

PAD_ID = 0
EOS_ID = 1
BOS_ID = 2
MASK_ID = 3
SPECIAL_IDS: tuple[int, int, int, int] = (PAD_ID, EOS_ID, BOS_ID, MASK_ID)
NEVER_GENERATED: tuple[int, int, int] = (PAD_ID, BOS_ID, MASK_ID)  # a sampler never writes these (EOS ends a text)
NUM_SPECIAL_TOKENS = len(SPECIAL_IDS)
#: Id of SentencePiece's unknown piece (the first content id); the char tokenizer has no unknown token.
SPM_UNK_ID = NUM_SPECIAL_TOKENS

CONFIG_FILE = "tokenizer.json"
SPM_MODEL_FILE = "spm.model"
_SPM_PIECES = {PAD_ID: "<pad>", EOS_ID: "</s>", BOS_ID: "<s>", MASK_ID: "<mask>", SPM_UNK_ID: "<spm_unk>"}


def _ids_to_array(ids: Any) -> np.ndarray:
    array = np.asarray(ids)
    if array.ndim != 1:
        raise ValueError(
            f"decode expects a 1-D sequence of token ids, got shape {array.shape}; decode rows one by one."
        )
    if array.size and not np.issubdtype(array.dtype, np.integer):
        raise ValueError(f"decode expects integer token ids, got dtype {array.dtype}.")
    return array.astype(np.int64)


class Tokenizer(abc.ABC):
    """Common interface. Subclasses implement ``vocab_size``, ``encode``, ``_decode_content`` and saving."""

    kind: ClassVar[str]

    @property
    @abc.abstractmethod
    def vocab_size(self) -> int:
        """Number of token ids, specials included (valid ids are ``0 .. vocab_size-1``)."""

    @property
    def special_ids(self) -> tuple[int, int, int, int]:
        """``(PAD_ID, EOS_ID, BOS_ID, MASK_ID) == (0, 1, 2, 3)``."""
        return SPECIAL_IDS

    @abc.abstractmethod
    def encode(self, text: str) -> list[int]:
        """Token ids of ``text``; no BOS/EOS added. Raises ValueError on characters outside the vocabulary."""

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        """``[encode(t) for t in texts]`` (subclasses may batch it)."""
        return [self.encode(text) for text in texts]

    def decode(self, ids: Sequence[int] | np.ndarray, stop_at_eos: bool = True) -> str:
        """Text of ``ids``: stops at the first EOS if ``stop_at_eos``, otherwise skips it; PAD/BOS/MASK are skipped."""
        array = _ids_to_array(ids)
        if array.size and (array.min() < 0 or array.max() >= self.vocab_size):
            bad = int(array[(array < 0) | (array >= self.vocab_size)][0])
            raise ValueError(f"token id {bad} is outside the vocabulary [0, {self.vocab_size}).")
        if stop_at_eos:
            eos_positions = np.flatnonzero(array == EOS_ID)
            if eos_positions.size:
                array = array[: eos_positions[0]]
        array = array[array >= NUM_SPECIAL_TOKENS]
        return self._decode_content(array.tolist())

    @abc.abstractmethod
    def _decode_content(self, ids: list[int]) -> str:
        """Decode ids that are all content ids (>= 4)."""

    @abc.abstractmethod
    def _save_files(self, directory: pathlib.Path) -> dict[str, Any]:
        """Write model files into ``directory``; return the extra fields for ``tokenizer.json``."""

    @classmethod
    @abc.abstractmethod
    def _from_files(cls, directory: pathlib.Path, config: dict[str, Any]) -> Tokenizer:
        """Inverse of ``_save_files``."""

    def save(self, directory: str | os.PathLike, metadata: dict[str, Any] | None = None) -> pathlib.Path:
        """Write ``tokenizer.json`` (kind, vocab size, specials, ``metadata``) and the model file into ``directory``."""
        directory = pathlib.Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        config = {
            "kind": self.kind,
            "vocab_size": self.vocab_size,
            "special_ids": {"pad": PAD_ID, "eos": EOS_ID, "bos": BOS_ID, "mask": MASK_ID},
            "metadata": dict(metadata or {}),
        }
        config.update(self._save_files(directory))
        (directory / CONFIG_FILE).write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
        return directory


# ----------------------------------------------------------------------------------------------------------------
# Characters
# ----------------------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class CharTokenizer(Tokenizer):
    """One token per character: ``chars[i]`` has id ``4 + i``. Unknown characters raise ValueError."""

    chars: tuple[str, ...]
    kind: ClassVar[str] = "char"

    def __post_init__(self):
        if any(not isinstance(c, str) or len(c) != 1 for c in self.chars):
            raise ValueError("CharTokenizer.chars must be single characters; build it with CharTokenizer.fit(text).")
        if len(set(self.chars)) != len(self.chars):
            raise ValueError("CharTokenizer.chars has duplicates; build it with CharTokenizer.fit(text).")
        if not self.chars:
            raise ValueError("CharTokenizer needs at least one character; fit it on a non-empty text.")
        codepoints = np.array([ord(c) for c in self.chars], dtype=np.int64)
        lookup = np.full(int(codepoints.max()) + 1, -1, dtype=np.int32)
        lookup[codepoints] = np.arange(len(self.chars), dtype=np.int32) + NUM_SPECIAL_TOKENS
        object.__setattr__(self, "_lookup", lookup)

    @classmethod
    def fit(cls, text: str) -> CharTokenizer:
        """The distinct characters of ``text``, sorted by code point (deterministic)."""
        if not isinstance(text, str):
            raise ValueError(f"CharTokenizer.fit expects one str, got {type(text).__name__}; join your texts first.")
        return cls(tuple(sorted(set(text))))

    @property
    def vocab_size(self) -> int:
        return NUM_SPECIAL_TOKENS + len(self.chars)

    def encode(self, text: str) -> list[int]:
        if not isinstance(text, str):
            raise ValueError(f"encode expects a str, got {type(text).__name__}.")
        codepoints = np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32).astype(np.int64)
        lookup = self._lookup  # type: ignore[attr-defined]
        in_range = codepoints < lookup.shape[0]
        ids = np.where(in_range, lookup[np.where(in_range, codepoints, 0)], -1)
        if (ids < 0).any():
            unknown = sorted({text[i] for i in np.flatnonzero(ids < 0)[:1000]})
            raise ValueError(
                f"characters {unknown!r} are not in the CharTokenizer vocabulary ({len(self.chars)} characters); "
                "fit the tokenizer on a text that contains them, or clean the input."
            )
        return ids.tolist()

    def _decode_content(self, ids: list[int]) -> str:
        return "".join(self.chars[i - NUM_SPECIAL_TOKENS] for i in ids)

    def _save_files(self, directory: pathlib.Path) -> dict[str, Any]:
        return {"chars": list(self.chars)}

    @classmethod
    def _from_files(cls, directory: pathlib.Path, config: dict[str, Any]) -> CharTokenizer:
        return cls(tuple(config["chars"]))


# ----------------------------------------------------------------------------------------------------------------
# SentencePiece
# ----------------------------------------------------------------------------------------------------------------


class SentencePieceTokenizer(Tokenizer):
    """A SentencePiece model whose ids 0..3 are PAD/EOS/BOS/MASK (checked at construction)."""

    kind: ClassVar[str] = "spm"

    def __init__(self, model_proto: bytes):
        self.model_proto = bytes(model_proto)
        self._processor = spm.SentencePieceProcessor(model_proto=self.model_proto)
        sp = self._processor
        actual = (sp.pad_id(), sp.eos_id(), sp.bos_id(), sp.piece_to_id("<mask>"), sp.unk_id())
        expected = (PAD_ID, EOS_ID, BOS_ID, MASK_ID, SPM_UNK_ID)
        if actual != expected or not sp.is_control(MASK_ID):
            raise ValueError(
                f"SentencePiece model has (pad, eos, bos, <mask>, unk) ids {actual}, expected {expected} with <mask> "
                "a control symbol; train it with SentencePieceTokenizer.train."
            )

    @classmethod
    def train(
        cls,
        lines_or_text: str | Iterable[str],
        vocab_size: int,
        model_type: str = "bpe",
        seed: int = 0,
        byte_fallback: bool = False,
    ) -> SentencePieceTokenizer:
        """Train in memory on ``lines_or_text`` (a str is split on ``"\\n"``; empty lines are skipped).

        Pass only the training split. ``character_coverage=1.0`` keeps every training character; with
        ``byte_fallback=True`` unseen characters are encoded as UTF-8 bytes (256 extra pieces) instead of raising.
        """
        if model_type not in ("bpe", "unigram"):
            raise ValueError(f"model_type must be 'bpe' or 'unigram', got {model_type!r}.")
        if isinstance(lines_or_text, str):
            lines = lines_or_text.split("\n")
        else:
            lines = list(lines_or_text)
        lines = [line for line in lines if line]
        if not lines:
            raise ValueError("SentencePieceTokenizer.train got no non-empty training lines.")
        if "\n" in "".join(lines[:1000]):
            raise ValueError("training lines must not contain '\\n'; pass one str (it is split on newlines).")
        num_reserved = len(_SPM_PIECES) + 1  # + "\n"
        if vocab_size <= num_reserved:
            raise ValueError(f"vocab_size must exceed the {num_reserved} reserved pieces, got {vocab_size}.")
        buffer = io.BytesIO()
        spm.set_random_generator_seed(seed)
        try:
            spm.SentencePieceTrainer.train(
                sentence_iterator=iter(lines),
                model_writer=buffer,
                vocab_size=vocab_size,
                model_type=model_type,
                pad_id=PAD_ID,
                eos_id=EOS_ID,
                bos_id=BOS_ID,
                unk_id=SPM_UNK_ID,
                pad_piece=_SPM_PIECES[PAD_ID],
                eos_piece=_SPM_PIECES[EOS_ID],
                bos_piece=_SPM_PIECES[BOS_ID],
                unk_piece=_SPM_PIECES[SPM_UNK_ID],
                control_symbols=[_SPM_PIECES[MASK_ID]],
                user_defined_symbols=["\n"],
                character_coverage=1.0,
                byte_fallback=byte_fallback,
                normalization_rule_name="identity",
                remove_extra_whitespaces=False,
                add_dummy_prefix=False,
                num_threads=2,
                minloglevel=2,
            )
        except RuntimeError as error:
            raise ValueError(
                f"SentencePiece training failed ({error}); for a small corpus lower vocab_size (got {vocab_size})."
            ) from error
        return cls(buffer.getvalue())

    def __getstate__(self) -> dict[str, Any]:  # picklable (e.g. for grain workers): the processor is rebuilt
        return {"model_proto": self.model_proto}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["model_proto"])

    @property
    def vocab_size(self) -> int:
        return self._processor.get_piece_size()

    def encode(self, text: str) -> list[int]:
        return self.encode_batch([text])[0]

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        if isinstance(texts, str) or any(not isinstance(t, str) for t in texts):
            raise ValueError("encode_batch expects a list of str.")
        encoded = self._processor.encode(list(texts), num_threads=2)
        for text, ids in zip(texts, encoded):
            if SPM_UNK_ID in ids:
                unknown = sorted({c for c in set(text) if SPM_UNK_ID in self._processor.encode(c)})
                raise ValueError(
                    f"characters {unknown!r} are not in the SentencePiece vocabulary; train on text that contains "
                    "them or train with byte_fallback=True."
                )
        return encoded

    def _decode_content(self, ids: list[int]) -> str:
        return self._processor.decode(ids)

    def id_to_piece(self, token_id: int) -> str:
        return self._processor.id_to_piece(int(token_id))

    def _save_files(self, directory: pathlib.Path) -> dict[str, Any]:
        (directory / SPM_MODEL_FILE).write_bytes(self.model_proto)
        return {"model_file": SPM_MODEL_FILE}

    @classmethod
    def _from_files(cls, directory: pathlib.Path, config: dict[str, Any]) -> SentencePieceTokenizer:
        return cls((directory / config["model_file"]).read_bytes())


# ----------------------------------------------------------------------------------------------------------------
# A pretrained checkpoint's own tokenizer (Hugging Face directories)
# ----------------------------------------------------------------------------------------------------------------

HF_SPM_FILE = "tokenizer.model"
HF_JSON_FILE = "tokenizer.json"


class PretrainedTokenizer(Tokenizer):
    """The tokenizer a pretrained checkpoint ships: `tokenizer.model` through sentencepiece when present, otherwise
    `tokenizer.json` through the `tokenizers` library (`pip install -e '.[hf]'`). Gemma's layout, PAD/EOS/BOS = 0/1/2,
    is checked; id 3 is Gemma's `<unk>`, which this toolbox reads as its MASK id (unused by uniform-noise models such as
    DiffusionGemma). Nothing is added to a text: the caller prepends BOS."""

    kind: ClassVar[str] = "pretrained"

    def __init__(self, model_file: str | os.PathLike):
        self.model_file = pathlib.Path(model_file)
        if self.model_file.suffix != ".json":  # a sentencepiece model (tokenizer.model)
            self._spm = spm.SentencePieceProcessor(model_file=str(self.model_file))
            specials = (self._spm.pad_id(), self._spm.eos_id(), self._spm.bos_id())
            self._size = self._spm.get_piece_size()
            self._json = None
        else:
            try:
                import tokenizers
            except ImportError:
                raise ImportError(
                    f"{self.model_file} needs the `tokenizers` library: pip install -e '.[hf]' (or tokenizers)."
                ) from None
            self._json = tokenizers.Tokenizer.from_file(str(self.model_file))
            self._spm = None
            self._size = self._json.get_vocab_size(with_added_tokens=True)
            vocab = self._json.get_vocab(with_added_tokens=True)
            specials = tuple(
                next((vocab[n] for n in names if n in vocab), -1)
                for names in (("<pad>", "[PAD]"), ("<eos>", "</s>"), ("<bos>", "<s>"))
            )
        if specials != (PAD_ID, EOS_ID, BOS_ID):
            raise ValueError(
                f"{self.model_file}: (pad, eos, bos) ids are {specials}, the toolbox needs {(PAD_ID, EOS_ID, BOS_ID)} "
                "(Gemma's layout)."
            )

    @classmethod
    def from_directory(cls, directory: str | os.PathLike) -> PretrainedTokenizer:
        directory = pathlib.Path(directory)
        for name in (HF_SPM_FILE, HF_JSON_FILE):
            if (directory / name).is_file():
                return cls(directory / name)
        raise FileNotFoundError(f"{directory} holds neither {HF_SPM_FILE} nor {HF_JSON_FILE}.")

    @property
    def vocab_size(self) -> int:
        return self._size

    def encode(self, text: str) -> list[int]:
        if self._spm is not None:
            return list(self._spm.encode(text))
        return list(self._json.encode(text, add_special_tokens=False).ids)

    def _decode_content(self, ids: list[int]) -> str:
        return self._spm.decode(ids) if self._spm is not None else self._json.decode(ids, skip_special_tokens=False)

    def _save_files(self, directory: pathlib.Path) -> dict[str, Any]:
        import shutil

        # the toolbox's own tokenizer.json (CONFIG_FILE) sits beside it, so a tokenizers file is saved renamed
        name = HF_SPM_FILE if self.model_file.suffix != ".json" else "pretrained_tokenizer.json"
        if self.model_file.resolve() != (directory / name).resolve():
            shutil.copyfile(self.model_file, directory / name)
        return {"model_file": name}

    @classmethod
    def _from_files(cls, directory: pathlib.Path, config: dict[str, Any]) -> PretrainedTokenizer:
        return cls(directory / config["model_file"])


_KINDS: dict[str, type[Tokenizer]] = {
    CharTokenizer.kind: CharTokenizer,
    SentencePieceTokenizer.kind: SentencePieceTokenizer,
    PretrainedTokenizer.kind: PretrainedTokenizer,
}


def load_tokenizer_config(directory: str | os.PathLike) -> dict[str, Any]:
    """The parsed ``tokenizer.json`` of a saved tokenizer (kind, vocab_size, metadata, ...)."""
    path = pathlib.Path(directory) / CONFIG_FILE
    if not path.is_file():
        raise FileNotFoundError(f"no {CONFIG_FILE} in {directory}; save a tokenizer there with tokenizer.save(dir).")
    return json.loads(path.read_text())


def load_tokenizer(directory: str | os.PathLike) -> Tokenizer:
    """Load whichever kind of tokenizer ``Tokenizer.save`` wrote into ``directory``."""
    config = load_tokenizer_config(directory)
    kind = config.get("kind")
    if kind not in _KINDS:
        raise ValueError(f"{CONFIG_FILE} in {directory} has unknown kind {kind!r}; known kinds: {sorted(_KINDS)}.")
    tokenizer = _KINDS[kind]._from_files(pathlib.Path(directory), config)
    if tokenizer.vocab_size != config["vocab_size"]:
        raise ValueError(
            f"{directory}: loaded vocab_size {tokenizer.vocab_size} != {config['vocab_size']} in {CONFIG_FILE}."
        )
    return tokenizer


# ----------------------------------------------------------------------------------------------------------------
# Export: a run's tokenizer as the file a Hugging Face directory carries
# ----------------------------------------------------------------------------------------------------------------


def char_tokenizer_json(tokenizer: CharTokenizer) -> str:
    """The `tokenizers` library's `tokenizer.json` of a character tokenizer: a word-level model whose words are single
    characters (every character its own pre-token), the specials by Gemma's names at 0..3, decoding that joins the
    tokens with nothing between them. Encoding a text gives `tokenizer.encode`'s ids; a character outside the
    vocabulary is an error, as here. Needs `tokenizers` (`pip install -e '.[hf]'`)."""
    try:
        from tokenizers import Regex, decoders, models, pre_tokenizers
        from tokenizers import Tokenizer as HFTokenizer
    except ImportError:
        raise ImportError(
            "exporting a character tokenizer as tokenizer.json needs the `tokenizers` library: pip install -e '.[hf]'."
        ) from None
    vocab = {_SPM_PIECES[i]: i for i in SPECIAL_IDS}
    vocab.update({c: NUM_SPECIAL_TOKENS + i for i, c in enumerate(tokenizer.chars)})
    if len(vocab) != tokenizer.vocab_size:  # a character spelled like a special piece would share its entry
        raise ValueError(f"the character vocabulary overlaps the special pieces {sorted(_SPM_PIECES.values())}.")
    out = HFTokenizer(models.WordLevel(vocab, unk_token=None))
    out.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")  # one pre-token per character
    out.decoder = decoders.Fuse()
    return out.to_str()


def save_hf_tokenizer(tokenizer: Tokenizer, directory: str | os.PathLike) -> pathlib.Path:
    """Writes `tokenizer` as the file a Hugging Face checkpoint directory carries and `PretrainedTokenizer` reads back
    with the same ids: a character tokenizer as `tokenizer.json` (`char_tokenizer_json`), a SentencePiece model as
    `tokenizer.model` (its bytes), a pretrained checkpoint's tokenizer as its own file. Returns the file written."""
    directory = pathlib.Path(directory)
    if isinstance(tokenizer, CharTokenizer):
        path = directory / HF_JSON_FILE
        path.write_text(char_tokenizer_json(tokenizer))
    elif isinstance(tokenizer, SentencePieceTokenizer):
        path = directory / HF_SPM_FILE
        path.write_bytes(tokenizer.model_proto)
    elif isinstance(tokenizer, PretrainedTokenizer):
        path = directory / (HF_JSON_FILE if tokenizer.model_file.suffix == ".json" else HF_SPM_FILE)
        path.write_bytes(tokenizer.model_file.read_bytes())
    else:
        name = type(tokenizer).__name__
        raise ValueError(f"no Hugging Face file for a {name}; export a char, spm or pretrained tokenizer.")
    return path
