"""The model-family registry: a `Family` is everything of a Hugging Face architecture that the
shared import code (export/hf/importer.py, config.py, tokenizer.py, weights.py) leaves to it, as
hooks; `register_family("MarianMTModel")` registers a class under the config.json `architectures`
name(s) it imports, and `family_for` finds the family of a config.json (refusing an unknown one
with the list of those registered).

The hooks, by stage of the import:
- config: `config_rules` (`config.ConfigRules`: norm placement, defaults, the settings its code
  fixes), through `model_config`;
- tokenizer: `tokenizer_classes`, `tokenizer_files` (checked before anything is loaded) and
  `import_tokenizer` (the files written into the model dir, the languages and their tokens);
- weights: `model_class` (the transformers class that loads the checkpoint), `position_table`,
  `logits_bias` and `extra_weights` (`weights.WeightHooks`);
- generation: `source_prefix` (the ids before a source sentence: its language token) and
  `forced_first` (the target token forced first); the decoder start, pad, eos and suppressed
  tokens come from config.json and generation_config.json through `model_config`."""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar, TypeVar

import torch

from export.hf.config import ConfigRules, HFImportError, HFModel, model_config, short
from export.hf.tokenizer import ImportedTokenizer, tokenizer_class
from export.model import ModelConfig

FAMILIES: dict[str, type[Family]] = {}  # config.json `architectures` name -> its family
_PACKAGE = "export.hf.families"
_NOT_FAMILIES = {"registry"}


class Family:
    """One model family; a subclass sets the class attributes and the hooks its family does its own
    way. An instance is the family of one checkpoint, `architecture` the name its config.json gives."""

    architectures: ClassVar[tuple[str, ...]] = ()  # set by register_family
    config_rules: ClassVar[ConfigRules]
    tokenizer_classes: ClassVar[tuple[str, ...]]  # the first: a folder that names none

    def __init__(self, architecture: str) -> None:
        self.architecture = architecture

    # -- config
    def model_config(self, hf: dict[str, Any], unk_id: int, generation: dict[str, Any] | None = None) -> HFModel:
        return model_config(hf, self.architecture, self.config_rules, unk_id, generation)

    # -- tokenizer
    def tokenizer_class(self, src: Path) -> str:
        return tokenizer_class(src, self.architecture, self.tokenizer_classes)

    def tokenizer_files(self, src: Path) -> list[str]:
        """The tokenizer files the folder must hold; HFImportError for a tokenizer class not taken."""
        raise NotImplementedError

    def import_tokenizer(
        self, src: Path, dst: Path, langs: tuple[str | None, str | None], texts: list[str], vocab_size: int
    ) -> ImportedTokenizer:
        """Write the tokenizer files of `src` into the model dir `dst`; `langs` are the source and
        target language given (None: the tokenizer's), `texts` those a tokenizer may be checked on,
        `vocab_size` the model's target vocabulary."""
        raise NotImplementedError

    # -- weights (weights.WeightHooks)
    def model_class(self) -> Any:
        """The transformers class that loads the checkpoint."""
        raise NotImplementedError

    def position_table(self, hf_model: Any, cfg: ModelConfig) -> torch.Tensor:
        raise NotImplementedError

    def logits_bias(self, hf_model: Any, cfg: ModelConfig) -> torch.Tensor:
        return torch.zeros(cfg.vocab_size)

    def extra_weights(self, hf_model: Any, out: dict[str, torch.Tensor]) -> None:
        return None

    # -- generation
    def source_prefix(self, tok: ImportedTokenizer) -> list[int]:
        """The ids before each source sentence (its </s> after): the source language's token, if any."""
        tokens = tok.languages.get("source_tokens", {})
        return [tokens[tok.src_lang]] if tok.src_lang in tokens else []

    def forced_first(self, tok: ImportedTokenizer) -> int | None:
        """The token forced first on the target (the target language's), or None."""
        token = tok.languages.get("target_tokens", {}).get(tok.tgt_lang)
        return int(token) if token is not None else None


F = TypeVar("F", bound=type[Family])


def register_family(*architectures: str) -> Callable[[F], F]:
    """Register the decorated Family under the config.json `architectures` names it imports."""

    def register(cls: F) -> F:
        taken = [a for a in architectures if a in FAMILIES and FAMILIES[a] is not cls]
        if not architectures or taken:
            raise ValueError(f"{cls.__name__}: architectures {list(architectures)} (taken: {taken})")
        cls.architectures = architectures
        FAMILIES.update(dict.fromkeys(architectures, cls))
        return cls

    return register


def load_families() -> None:
    """Import every module of export/hf/families/, which registers the families they declare."""
    for module in pkgutil.iter_modules([str(Path(__file__).parent)]):
        if module.name not in _NOT_FAMILIES and not module.name.startswith("_"):
            importlib.import_module(f"{_PACKAGE}.{module.name}")


def supported() -> list[str]:
    load_families()
    return sorted(FAMILIES)


def family_for(hf: dict[str, Any]) -> Family:
    """The family of config.json `hf`, by its `architectures`; HFImportError with the list of the
    supported ones for an unknown one."""
    archs = hf.get("architectures")
    names = supported()
    if not isinstance(archs, list) or len(archs) != 1 or archs[0] not in FAMILIES:
        raise HFImportError(f"config.json: `architectures` is {short(archs)}; mtserve imports one of {names}")
    return FAMILIES[archs[0]](archs[0])
