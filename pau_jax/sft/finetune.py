"""The ft baseline's trainer: LoRA fine-tuning on (prompt -> answer) pairs, early-stopped on a held-out slice.

`train_adapter` is what `evaluation.pipeline.evaluate` calls for the 'ft' mode
(gin: `pau_jax.experiment.evaluate.baselines = {'ft': @pau_jax.sft.finetune.train_adapter}`):
the pairs are the train split's in-context prompts with their gold descriptions.
A small deterministic slice of the pairs (chosen by a hash of each pair's id, so
it does not depend on their order) is held out; after every epoch the token-mean
NLL on it is measured, the adapter with the lowest one is kept (exported as a PEFT
adapter), and training stops once it has not improved for `patience` epochs.

The run is a `training.run.Run` (base model, tokenizer, LoRA, checkpointer, metrics
writer) and its epochs are `sft.trainer.run_epochs`. Files in `out_dir`: `adapter/`
(the best adapter so far), `checkpoints/` (the train state after the latest epoch,
orbax), `history.json` (per epoch: train loss, held-out NLL; also `metrics.jsonl` as
`ft/train_loss`, `ft/held_out_nll`) and `summary.json` once finished. A rerun continues
after the last finished epoch, or returns the adapter at once when training had finished.
"""

import dataclasses
import functools
import hashlib
import json
import pathlib
from collections.abc import Sequence

import jax
import jax.numpy as jnp

from pau_jax.sft import trainer
from pau_jax.sft.pairs import SFTExample, end_of_turn_id, make_example, pad_id
from pau_jax.sft.trainer import SFTConfig
from pau_jax.training import artefacts
from pau_jax.training import run as run_lib
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


def examples(
    pairs: Sequence[dict], tokenizer, *, enable_thinking: bool = False
) -> list[SFTExample]:
    """Token pairs: the chat template of `messages` with the generation prompt -> `completion` + end of turn."""
    end = end_of_turn_id(tokenizer)
    return [
        make_example(
            tokenizer,
            pair["messages"],
            pair["completion"],
            end=end,
            enable_thinking=enable_thinking,
        )
        for pair in pairs
    ]


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
    out = pathlib.Path(out_dir)
    fingerprint = _fingerprint(checkpoint_dir, pairs, config)
    if _finished(out, fingerprint):
        print(f"[ft] already trained; adapter {out / 'adapter'}", flush=True)
        return str(out / "adapter")
    actor = run_lib.ActorConfig(
        checkpoint=checkpoint_dir,
        tokenizer=tokenizer,
        dtype=dtype,
        lora_rank=config.lora_rank,
        lora_alpha=config.lora_alpha,
    )
    with run_lib.open_run(out_dir, actor, seed=config.sft.seed, max_checkpoints=1, tag="ft") as run:
        data = _Data.build(pairs, run.tokenizer, config)
        history = _train(run, data, config, fingerprint)
        run.close()
    best, _ = trainer.best_epoch(trainer.held_out_losses(history), config.patience)
    summary = {
        "fingerprint": fingerprint,
        "best_epoch": best + 1,
        "epochs_run": len(history),
        "history": history,
        "train_pairs": len(data.train),
        "held_out_pairs": len(data.held_out),
        "dropped_pairs": data.dropped,
        "adapter": str(out / "adapter"),
    }
    artefacts.replace_text(out / "summary.json", json.dumps(summary, indent=2) + "\n")
    return str(out / "adapter")


def _mismatch(out: pathlib.Path) -> ValueError:
    return ValueError(f"{out} holds a fine-tuning of other pairs or settings; use a new run_dir")


def _finished(out: pathlib.Path, fingerprint: str) -> bool:
    """Whether `out` holds a finished fine-tuning (of these pairs and settings; else raises)."""
    path = out / "summary.json"
    if not path.exists():
        return False
    if json.loads(path.read_text()).get("fingerprint") != fingerprint:
        raise _mismatch(out)
    return True


@dataclasses.dataclass(frozen=True, kw_only=True)
class _Data:
    """The token pairs that fit `max_length`: train, held out, and how many were dropped."""

    train: list[SFTExample]
    held_out: list[SFTExample]
    dropped: int

    @classmethod
    def build(cls, pairs: Sequence[dict], tok, config: FineTuneConfig) -> "_Data":
        """Splits, tokenises and length-filters the pairs; raises when a slice ends up empty."""
        max_length = config.sft.max_length
        train_pairs, held_pairs = split_pairs(pairs, config.validation_fraction)

        def fitting(items):
            made = examples(items, tok, enable_thinking=config.enable_thinking)
            return [e for e in made if len(e.prompt_ids) + len(e.completion_ids) <= max_length]

        train, held_out = fitting(train_pairs), fitting(held_pairs)
        dropped = len(pairs) - len(train) - len(held_out)
        if not train or (held_pairs and not held_out):
            raise ValueError(
                f"no fine-tuning pair fits SFTConfig.max_length={max_length} in the train or "
                "held-out slice; raise max_length"
            )
        print(
            f"[ft] {len(train)} train pairs, {len(held_out)} held out, {dropped} longer than "
            f"{max_length} tokens dropped",
            flush=True,
        )
        return cls(train=train, held_out=held_out, dropped=dropped)


def _train(run: run_lib.Run, data: _Data, config: FineTuneConfig, fingerprint: str) -> list[dict]:
    """Resumes the run's latest epoch and trains the rest (`trainer.run_epochs`); the history."""
    sft, model = config.sft, run.model
    pad = pad_id(run.tokenizer)
    step_fn = trainer.make_sft_step(model, sft)
    start, done = step_lib.init_state(model, sft.optimizer()), []
    latest = run.checkpointer.latest_step()
    if latest is not None:
        start, extra = run.checkpointer.restore(latest, start)
        if extra.get("fingerprint") != fingerprint:
            raise _mismatch(run.out)
        done = list(extra["history"])
        print(f"[ft] resuming after epoch {latest}", flush=True)
    evaluate = None
    if data.held_out:
        evaluate = functools.partial(
            trainer.mean_nll, model=model, examples=data.held_out, config=sft, pad=pad
        )
    history = done
    for state, history in trainer.run_epochs(
        step_fn,
        start,
        data.train,
        sft,
        pad=pad,
        history=done,
        evaluate=evaluate,
        patience=config.patience,
    ):
        _end_epoch(run, state, history, config, fingerprint)
    return history


def _end_epoch(
    run: run_lib.Run, state, history: list[dict], config: FineTuneConfig, fingerprint: str
) -> None:
    """Exports the adapter if this epoch is the best so far, logs, checkpoints and writes history.json."""
    epoch, record = len(history) - 1, history[-1]
    best, stop = trainer.best_epoch(trainer.held_out_losses(history), config.patience)
    if best == epoch:  # The model gets copies, so the next step's donation leaves it intact.
        step_lib.sync_model(
            run.model, dataclasses.replace(state, lora=jax.tree.map(jnp.copy, state.lora))
        )
        run.export_adapter()
    held = record["held_out_nll"]
    print(
        f"[ft] epoch {epoch + 1}/{config.sft.epochs}: train loss {record['train_loss']:.4f}, "
        f"held-out NLL {'n/a' if held is None else f'{held:.4f}'}, best epoch {best + 1}",
        flush=True,
    )
    run.checkpointer.save(epoch + 1, state, extra={"fingerprint": fingerprint, "history": history})
    metrics = {"ft/train_loss": record["train_loss"]}
    if held is not None:
        metrics["ft/held_out_nll"] = held
    run.writer.write(epoch + 1, metrics)
    artefacts.replace_text(run.out / "history.json", json.dumps(history, indent=2) + "\n")
    if stop:
        print(f"[ft] early stop: no improvement for {config.patience} epochs", flush=True)
