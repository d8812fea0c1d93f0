"""The ft baseline's trainer: LoRA fine-tuning on (prompt -> answer) pairs, early-stopped on a held-out slice.

`train_adapter` is what `evaluation.pipeline.evaluate` calls for the 'ft' mode
(gin: `pau_jax.experiment.evaluate.fine_tune_fn = @pau_jax.sft.finetune.train_adapter`):
the pairs are the train split's in-context prompts with their gold descriptions.
A small deterministic slice of the pairs (chosen by a hash of each pair's id, so
it does not depend on their order) is held out; after every epoch the token-mean
NLL on it is measured, the adapter with the lowest one is kept (exported as a PEFT
adapter), and training stops once it has not improved for `patience` epochs.

Files in `out_dir`: `adapter/` (the best adapter so far), `checkpoints/` (the
train state after the latest epoch, orbax), `history.json` (per epoch: train loss,
held-out NLL) and `summary.json` once finished. A rerun continues after the last
finished epoch, or returns the adapter at once when training had finished.
"""

import dataclasses
import functools
import hashlib
import json
import pathlib
import shutil
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from pau_jax.sft import trainer
from pau_jax.sft.trainer import SFTConfig, SFTExample
from pau_jax.training import step as step_lib


@dataclasses.dataclass(frozen=True, kw_only=True)
class FineTuneConfig:
    """Settings of the ft baseline (the released code's: lr 2e-5, 5 epochs, batch 8, patience 3).

    Attributes:
      sft: optimiser, epochs, batching, length limit and shuffle seed.
      lora_rank, lora_alpha: the adapters (on every linear layer).
      validation_fraction: share of the pairs held out for early stopping (at
        least one pair when > 0); 0 trains every epoch and keeps the last adapter.
      patience: epochs without a lower held-out NLL before stopping.
      enable_thinking: passed to the chat template, as the policy's `SamplingConfig`.
    """

    sft: SFTConfig = SFTConfig(learning_rate=2e-5, epochs=5, batch_size=8)
    lora_rank: int = 16
    lora_alpha: float = 16.0
    validation_fraction: float = 0.1
    patience: int = 3
    enable_thinking: bool = False

    def __post_init__(self):
        if not 0 <= self.validation_fraction < 1:
            raise ValueError(
                f"validation_fraction must be in [0, 1), got {self.validation_fraction}"
            )
        if self.patience < 1:
            raise ValueError(f"patience must be >= 1, got {self.patience}")


def split_pairs(pairs: Sequence[dict], fraction: float) -> tuple[list[dict], list[dict]]:
    """(train, held out): the held-out slice is the pairs whose id hashes lowest.

    Args:
      pairs: dicts with a unique `id`.
      fraction: share held out; at least one pair when > 0, and at least one pair
        is always left to train on.

    Raises:
      ValueError: duplicate ids, or too few pairs to hold one out.
    """
    ids = [p["id"] for p in pairs]
    if len(set(ids)) != len(ids):
        raise ValueError("fine-tuning pairs need unique ids")
    if fraction <= 0:
        return list(pairs), []
    if len(pairs) < 2:
        raise ValueError(
            f"{len(pairs)} fine-tuning pair(s): early stopping needs at least 2 "
            "(or validation_fraction=0)"
        )
    n_val = min(max(1, round(fraction * len(pairs))), len(pairs) - 1)
    ranked = sorted(pairs, key=lambda p: hashlib.sha256(str(p["id"]).encode()).hexdigest())
    held = {p["id"] for p in ranked[:n_val]}
    return [p for p in pairs if p["id"] not in held], [p for p in pairs if p["id"] in held]


def best_epoch(losses: Sequence[float | None], patience: int) -> tuple[int, bool]:
    """(index of the best epoch so far, whether to stop) from per-epoch held-out losses.

    The best epoch has the lowest loss (the earliest on ties); training stops when
    the last `patience` epochs all came after it. Without held-out losses (None)
    the last epoch is the best and training never stops early.
    """
    if not losses:
        raise ValueError("best_epoch needs at least one epoch")
    if any(x is None for x in losses):
        return len(losses) - 1, False
    best = int(np.argmin(losses))
    return best, len(losses) - 1 - best >= patience


def examples(
    pairs: Sequence[dict], tokenizer, *, enable_thinking: bool = False
) -> list[SFTExample]:
    """Token pairs: the chat template of `messages` with the generation prompt -> `completion` + end of turn."""
    end = trainer.end_of_turn_id(tokenizer)
    return [
        trainer.make_example(
            tokenizer,
            pair["messages"],
            pair["completion"],
            end=end,
            enable_thinking=enable_thinking,
        )
        for pair in pairs
    ]


@functools.partial(jax.jit, static_argnums=(0, 1))
def _nll_sums(graphdef, loss: trainer.NLLLoss, base, lora, batch):
    """(sum of token NLL, number of tokens) of a batch under the base plus `lora`."""
    loss_sum, denominator, _ = loss(nnx.merge(graphdef, lora, base), batch)
    return loss_sum, denominator


def _export(model, state, path: pathlib.Path, base_name: str) -> None:
    """Writes the state's adapters as a PEFT folder, replacing `path` atomically."""
    from pau_jax.models import lora

    step_lib.sync_model(model, dataclasses.replace(state, lora=jax.tree.map(jnp.copy, state.lora)))
    tmp = path.with_name(path.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    lora.export_peft(model, tmp, base_model_name_or_path=base_name)
    shutil.rmtree(path, ignore_errors=True)
    tmp.rename(path)


def _fingerprint(checkpoint_dir: str, pairs: Sequence[dict], config: FineTuneConfig) -> str:
    data = [[p["id"], p["messages"], p["completion"]] for p in pairs]
    text = json.dumps([str(checkpoint_dir), data, repr(config)], sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def train_adapter(
    *,
    checkpoint_dir: str,
    out_dir: str,
    pairs: Sequence[dict],
    dtype: str = "float32",
    tokenizer: str | None = None,
    config: FineTuneConfig = FineTuneConfig(),
) -> str:
    """Fine-tunes LoRA adapters of a checkpoint on the pairs; returns the best adapter's folder.

    Args:
      checkpoint_dir: the base model (Hugging Face folder).
      out_dir: where the adapter, checkpoints and history go (a rerun resumes).
      pairs: dicts with `id`, `messages` (the prompt as chat messages) and
        `completion` (the answer to learn).
      dtype: parameter dtype of the base model.
      tokenizer: tokenizer folder or 'qwen3-offline'; default the checkpoint's own.
      config: the settings.

    Raises:
      ValueError: `out_dir` holds a fine-tuning of other pairs or settings, or no
        pair fits `config.sft.max_length`.
    """
    from pau_jax import models
    from pau_jax.models import lora
    from pau_jax.tokenizer import load_tokenizer
    from pau_jax.training import checkpoint

    out = pathlib.Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    adapter_dir = out / "adapter"
    fingerprint = _fingerprint(checkpoint_dir, pairs, config)
    summary_path = out / "summary.json"
    if summary_path.exists():
        summary = json.loads(summary_path.read_text())
        if summary.get("fingerprint") != fingerprint:
            raise ValueError(
                f"{out} holds a fine-tuning of other pairs or settings; use a new run_dir"
            )
        print(f"[ft] already trained; adapter {adapter_dir}", flush=True)
        return str(adapter_dir)

    sft = config.sft
    tok = load_tokenizer(tokenizer or pathlib.Path(checkpoint_dir).expanduser())
    train_pairs, held_pairs = split_pairs(pairs, config.validation_fraction)

    def fitting(items):
        made = examples(items, tok, enable_thinking=config.enable_thinking)
        return [e for e in made if len(e.prompt_ids) + len(e.completion_ids) <= sft.max_length]

    train_ex, held_ex = fitting(train_pairs), fitting(held_pairs)
    dropped = len(train_pairs) + len(held_pairs) - len(train_ex) - len(held_ex)
    if not train_ex or (held_pairs and not held_ex):
        raise ValueError(
            f"no fine-tuning pair fits SFTConfig.max_length={sft.max_length} in the train or "
            "held-out slice; raise max_length"
        )
    print(
        f"[ft] {len(train_ex)} train pairs, {len(held_ex)} held out, {dropped} longer than "
        f"{sft.max_length} tokens dropped",
        flush=True,
    )
    model, _ = models.load_hf(pathlib.Path(checkpoint_dir).expanduser(), dtype=dtype)
    lora.apply_lora(model, rank=config.lora_rank, alpha=config.lora_alpha, seed=sft.seed)
    pad = trainer.pad_id(tok)
    step_fn = trainer.make_sft_step(model, sft)
    graphdef, _, _ = step_lib.split_model(model)
    nll = functools.partial(
        _nll_sums, graphdef, trainer.NLLLoss(chunk_tokens=sft.logits_chunk_tokens)
    )
    state = step_lib.init_state(model, sft.optimizer())
    history: list[dict] = []
    with checkpoint.Checkpointer(out / "checkpoints", max_to_keep=1) as ckpt:
        latest = ckpt.latest_step()
        if latest is not None:
            state, extra = ckpt.restore(latest, state)
            if extra.get("fingerprint") != fingerprint:
                raise ValueError(
                    f"{out} holds a fine-tuning of other pairs or settings; use a new run_dir"
                )
            history = list(extra["history"])
            print(f"[ft] resuming after epoch {latest}", flush=True)
        stop = (
            bool(history) and best_epoch([h["held_out_nll"] for h in history], config.patience)[1]
        )
        while len(history) < sft.epochs and not stop:
            epoch = len(history)
            order = np.random.default_rng([sft.seed, epoch]).permutation(len(train_ex))
            losses = []
            for batch in trainer.batches([train_ex[i] for i in order], sft, pad):
                state, metrics = step_fn(state, batch)
                losses.append(float(metrics["sft/loss"]))
            held = None
            if held_ex:
                total, count = 0.0, 0.0
                for batch in trainer.batches(held_ex, sft, pad):
                    s, n = nll(step_fn.base, state.lora, batch)
                    total, count = total + float(s), count + float(n)
                held = total / max(count, 1.0)
            history.append(
                {"epoch": epoch, "train_loss": float(np.mean(losses)), "held_out_nll": held}
            )
            best, stop = best_epoch([h["held_out_nll"] for h in history], config.patience)
            if best == epoch:
                _export(model, state, adapter_dir, str(checkpoint_dir))
            held_text = "n/a" if held is None else f"{held:.4f}"
            print(
                f"[ft] epoch {epoch + 1}/{sft.epochs}: train loss {history[-1]['train_loss']:.4f}, "
                f"held-out NLL {held_text}, best epoch {best + 1}",
                flush=True,
            )
            ckpt.save(epoch + 1, state, extra={"fingerprint": fingerprint, "history": history})
            (out / "history.json").write_text(json.dumps(history, indent=2) + "\n")
            if stop:
                print(f"[ft] early stop: no improvement for {config.patience} epochs", flush=True)
    best, _ = best_epoch([h["held_out_nll"] for h in history], config.patience)
    summary = {
        "fingerprint": fingerprint,
        "best_epoch": best + 1,
        "epochs_run": len(history),
        "history": history,
        "train_pairs": len(train_ex),
        "held_out_pairs": len(held_ex),
        "dropped_pairs": dropped,
        "adapter": str(adapter_dir),
    }
    summary_path.write_text(json.dumps(summary, indent=2) + "\n")
    return str(adapter_dir)
