"""A chat task small enough to post-train on a CPU in seconds, built entirely in code.

Shared by ``examples/trl_sft.py``, ``trl_dpo.py``, ``trl_grpo.py`` and their
tests (``tests/layercheck/test_trl.py``, ``test_rlstate.py``): the tokenizer, the
model, the SFT, DPO and GRPO datasets, GRPO's reward, the LoRA adapter, and the
command line the scripts share (``main``: where the LayerCheck callback is made
and the run resumed). Nothing comes from a model hub.

The task: the user asks ``count from 7 by 3``, the assistant answers
``10 13 16 19``. SFT trains on the answers (prompt-completion, conversational:
TRL renders both through the chat template below and computes the loss on the
completion only); DPO prefers the right answer to one counted by another stride;
GRPO samples answers and rewards each number by how close it is to the right one.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
from pathlib import Path
from typing import Any, Callable

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing here needs a hub; never ask one

import torch  # noqa: E402
from finetune_trainer import LossLog  # noqa: E402  (the plain Trainer example's)
from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM  # noqa: E402

from layercheck import LayerCheckConfig  # noqa: E402
from layercheck.trainer import LayerCheckCallback  # noqa: E402

NUMBERS = 64
"""Numbers 0..63 are words of the vocabulary; the task stays below 64."""
TERMS = 4
"""Numbers in an answer."""
SPECIAL = ["<pad>", "<unk>", "<eos>", "<user>", "<assistant>"]
WORDS = ["count", "from", "by"]
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<' + message['role'] + '> ' + message['content'] + ' <eos> ' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<assistant> ' }}{% endif %}")
"""One turn: ``<role> content <eos>``; the generation prompt opens the assistant's turn,
so a rendered prompt is a prefix of the rendered prompt and completion (TRL checks)."""
PRETRAIN_STEPS = 120


def tokenizer() -> PreTrainedTokenizerFast:
    """A word-level tokenizer over the task's words (``tokenizers``' WordLevel), with
    the chat template above; pad, eos and unk set."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    vocab = {w: i for i, w in enumerate(SPECIAL + WORDS + [str(n) for n in range(NUMBERS)])}
    core = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    wrapped = PreTrainedTokenizerFast(tokenizer_object=core, pad_token="<pad>", unk_token="<unk>",
                                      eos_token="<eos>", additional_special_tokens=SPECIAL[3:])
    wrapped.chat_template = CHAT_TEMPLATE
    return wrapped


def model(seed: int = 0) -> Qwen2ForCausalLM:
    """A small Qwen2 causal LM with random weights fixed by ``seed`` (untied head, like
    Qwen2.5-7B; attention dropout on, so a resume is exact only if the RNGs are restored)."""
    words = tokenizer()
    torch.manual_seed(seed)
    config = Qwen2Config(
        vocab_size=len(words), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32,
        attention_dropout=0.1, tie_word_embeddings=False, pad_token_id=words.pad_token_id,
        bos_token_id=None, eos_token_id=words.eos_token_id)
    return Qwen2ForCausalLM(config)


def base_model(folder: "str | os.PathLike[str]", *, seed: int = 0) -> Path:
    """``folder`` holding the pretrained model the post-training starts from (weights,
    config and tokenizer, as ``save_pretrained`` writes them), pretrained here first
    if the folder does not hold it yet: ``PRETRAIN_STEPS`` steps of plain language
    modelling on counting sequences (no chat), a few seconds. Post-training a random
    model would leave a LoRA adapter nothing to steer; this base knows how to count,
    and SFT teaches it to answer. Written to a temporary folder and renamed, so a run
    killed meanwhile leaves no half-written base."""
    folder = Path(folder)
    if (folder / "model.safetensors").is_file():
        return folder
    lm, words = model(seed), tokenizer()
    first = words.convert_tokens_to_ids("0")
    optimizer = torch.optim.AdamW(lm.parameters(), lr=5e-3)
    g = torch.Generator().manual_seed(seed + 1)
    lm.train()
    for _ in range(PRETRAIN_STEPS):
        start = torch.randint(0, NUMBERS - 8 * 5, (32, 1), generator=g)
        stride = torch.randint(1, 6, (32, 1), generator=g)
        ids = first + start + stride * torch.arange(9)
        lm(input_ids=ids, labels=ids).loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    staging = folder.with_name(f".{folder.name}.{os.getpid()}.tmp")
    shutil.rmtree(staging, ignore_errors=True)
    lm.save_pretrained(staging)
    words.save_pretrained(staging)
    try:
        staging.rename(folder)
    except OSError:  # another process finished it first
        shutil.rmtree(staging, ignore_errors=True)
        if not (folder / "model.safetensors").is_file():
            raise
    return folder


def load(folder: "str | os.PathLike[str]") -> tuple[Qwen2ForCausalLM, PreTrainedTokenizerFast]:
    """The model (fp32, train mode) and tokenizer in ``folder``, read from disk only."""
    lm = Qwen2ForCausalLM.from_pretrained(folder, dtype=torch.float32, local_files_only=True)
    lm.train()
    # not AutoTokenizer: it goes by the config's model_type and would rebuild the word-level
    # tokenizer as Qwen2's byte-level BPE, which splits the words differently
    return lm, PreTrainedTokenizerFast.from_pretrained(folder, local_files_only=True)


def _questions(size: int, seed: int) -> list[tuple[int, int]]:
    g = torch.Generator().manual_seed(seed)
    start = torch.randint(0, NUMBERS - 5 * TERMS, (size,), generator=g).tolist()
    stride = torch.randint(1, 6, (size,), generator=g).tolist()
    return list(zip(start, stride))


def _turn(role: str, content: str) -> list[dict[str, str]]:
    return [{"role": role, "content": content}]


def _answer(start: int, stride: int) -> str:
    return " ".join(str(start + stride * (i + 1)) for i in range(TERMS))


def sft_dataset(size: int, seed: int) -> Any:
    """``size`` conversational prompt-completion examples fixed by ``seed``."""
    from datasets import Dataset
    return Dataset.from_list([
        {"prompt": _turn("user", f"count from {a} by {s}"),
         "completion": _turn("assistant", _answer(a, s))} for a, s in _questions(size, seed)])


def dpo_dataset(size: int, seed: int) -> Any:
    """``size`` conversational preference pairs fixed by ``seed``: the chosen answer
    counts by the asked stride, the rejected one by the next stride (mod 5)."""
    from datasets import Dataset
    return Dataset.from_list([
        {"prompt": _turn("user", f"count from {a} by {s}"),
         "chosen": _turn("assistant", _answer(a, s)),
         "rejected": _turn("assistant", _answer(a, s % 5 + 1))} for a, s in _questions(size, seed)])


def grpo_dataset(size: int, seed: int) -> Any:
    """``size`` conversational prompts fixed by ``seed``, each with the ``answer`` the
    reward function checks against (TRL passes extra columns to reward functions)."""
    from datasets import Dataset
    return Dataset.from_list([{"prompt": _turn("user", f"count from {a} by {s}"),
                               "answer": _answer(a, s)} for a, s in _questions(size, seed)])


def count_reward(completions: list[Any], answer: list[str], **kwargs: Any) -> list[float]:
    """The rule-based reward of GRPO: per completion, the mean over the ``TERMS`` places
    of ``answer`` of how close the number said there is to the right one (1 when equal,
    falling linearly to 0 at 8 or more apart; a word that is not a number, or a missing
    one, scores 0). Graded, so that a group of wrong answers still tells better from worse."""
    rewards = []
    for completion, expected in zip(completions, answer):
        text = completion[-1]["content"] if isinstance(completion, list) else completion
        said = text.split()[:TERMS]
        score = sum(max(0.0, 1 - abs(int(word) - int(right)) / 8) if word.isdigit() else 0.0
                    for word, right in zip(said, expected.split()))
        rewards.append(score / TERMS)
    return rewards


def answer_loss(model: Any, tokenizer: PreTrainedTokenizerFast, questions: Any) -> float:
    """The held-out loss of a GRPO-trained policy: the mean next-token loss of the
    ``TERMS`` numbers of the right answer after each prompt of ``questions``
    (``grpo_dataset``), teacher-forced, in eval mode: deterministic, unlike a sampled
    reward. (No ``<eos>``: GRPO here samples exactly ``TERMS`` tokens.)"""
    was_training = model.training
    model.eval()
    total, count = 0.0, 0
    with torch.no_grad():
        for row in questions:
            prompt = tokenizer.apply_chat_template(row["prompt"], add_generation_prompt=True,
                                                   tokenize=False)
            head = tokenizer(prompt, add_special_tokens=False)["input_ids"]
            tail = tokenizer(row["answer"], add_special_tokens=False)["input_ids"]
            ids = torch.tensor([head + tail])
            labels = torch.tensor([[-100] * len(head) + tail])
            total += float(model(input_ids=ids, labels=labels).loss) * len(tail)
            count += len(tail)
    model.train(was_training)
    return total / count


def lora(rank: int) -> Any:
    """A PEFT LoRA adapter of ``rank`` on every linear layer of the blocks (PEFT's
    ``all-linear``: the head stays as it is)."""
    from peft import LoraConfig
    return LoraConfig(r=rank, lora_alpha=2 * rank, lora_dropout=0.1,
                      target_modules="all-linear", task_type="CAUSAL_LM")


def training_arguments(out: str, *, steps: int, lr: float, seed: int) -> dict[str, Any]:
    """What both trainers' configs share: CPU, fp32 (TRL's configs default to bf16),
    one log entry per step, no checkpoints of the Trainer's own (LayerCheck is the
    checkpointing), nothing reported anywhere."""
    return dict(output_dir=out, max_steps=steps, per_device_train_batch_size=8,
                learning_rate=lr, lr_scheduler_type="linear", warmup_steps=max(1, steps // 10),
                logging_steps=1, save_strategy="no", report_to="none", use_cpu=True, bf16=False,
                disable_tqdm=True, seed=seed, dataset_num_proc=None)


def command_line(description: str, *, lr: float, lora_lr: float,
                 threshold: float) -> argparse.ArgumentParser:
    """The options both scripts take; ``lr`` and ``lora_lr`` are the default learning
    rates of full fine-tuning and of a LoRA adapter (adapters take larger steps),
    ``threshold`` the default drift threshold."""
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--ckpt", required=True, help="the layercheck directory")
    ap.add_argument("--out", help="the Trainer's output_dir (default: <ckpt>-out)")
    ap.add_argument("--base", help="the pretrained model's folder, pretrained there first if "
                    "it does not hold one (default: <ckpt>-base)")
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--lr", type=float, help=f"learning rate (default: {lr}, {lora_lr} with --lora)")
    ap.add_argument("--lora", type=int, default=0, metavar="R",
                    help="train a PEFT LoRA adapter of rank R instead of every weight (0: full)")
    ap.add_argument("--threshold", type=float, default=threshold,
                    help=f"drift threshold of every layer (default: {threshold})")
    ap.add_argument("--warmup-steps", type=int, default=10)
    ap.add_argument("--smax", type=int, default=40)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--losses", help="append one JSON line per step here")
    ap.set_defaults(default_lr=(lr, lora_lr))
    return ap


def parse(ap: argparse.ArgumentParser) -> argparse.Namespace:
    """The options, the learning rate filled in for full or LoRA fine-tuning."""
    args = ap.parse_args()
    if args.lora < 0:
        ap.error(f"--lora {args.lora}: give a rank of at least 1, or 0 to train every weight")
    if args.lr is None:
        args.lr = args.default_lr[1 if args.lora else 0]
    return args


def main(build_trainer: Callable[..., Any], description: str, *, lr: float, lora_lr: float,
         threshold: float, evaluate: Callable[[Any], dict[str, Any]] | None = None) -> None:
    """The command line of ``examples/trl_sft.py``, ``trl_dpo.py`` and ``trl_grpo.py``:
    ``build_trainer(base, out, steps=, lr=, lora=, seed=, callbacks=)`` makes the
    script's trainer. The first run starts at step 0; a run over a directory that
    holds checkpoints resumes at its newest committed step. Prints the summary
    (resumed step, final step, final training loss, and the held-out figures of
    ``evaluate(trainer)``, default the trainer's ``eval_loss``) as JSON."""
    args = parse(command_line(description, lr=lr, lora_lr=lora_lr, threshold=threshold))
    torch.set_num_threads(1)
    layercheck = LayerCheckCallback(args.ckpt, LayerCheckConfig(
        base_threshold=args.threshold, embedding_threshold=args.threshold,
        warmup_steps=args.warmup_steps, smax=args.smax))
    logs = [LossLog(args.losses)] if args.losses else []
    out = args.out or f"{os.fspath(args.ckpt).rstrip('/')}-out"
    base = base_model(args.base or f"{os.fspath(args.ckpt).rstrip('/')}-base", seed=args.seed)
    trainer = build_trainer(base, out, steps=args.steps, lr=args.lr, lora=args.lora,
                            seed=args.seed, callbacks=[layercheck, *logs])
    # trainer=: what the trainer holds beside the policy (a reference model) is checked too
    result = trainer.train(resume_from_checkpoint=layercheck.resume_checkpoint(trainer=trainer))
    final = next((e["loss"] for e in reversed(trainer.state.log_history) if "loss" in e), None)
    held_out = evaluate(trainer) if evaluate else {"eval_loss": trainer.evaluate()["eval_loss"]}
    print(json.dumps({"resumed_at": layercheck.restored_step, "global_step": result.global_step,
                      "final_loss": final, **held_out}))
