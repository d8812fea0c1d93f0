"""What every training run mode shares: the run directory, the actor with its adapters, the mesh.

    with run.open_run(run_dir, actor, seed=0) as r:      # model, tokenizer, checkpointer, writer
        ... r.model, r.tokenizer, r.checkpointer, r.writer, r.to_layout(rules), r.base_policy(s)
        summary = r.finish({"mode": "grpo", ...})        # adapter/ and summary.json

AAC (``rl.loop.train``), distillation (``sft.distill.distill``) and the ft
baseline (``sft.finetune.train_adapter``, which exports its best epoch's adapter
with ``r.export_adapter()`` and ends with ``r.close()`` and its own summary) all
start here, so a new algorithm's run mode only adds its own loop.

A run directory survives a kill at any moment: the random base model, the
adapter folder and summary.json are written under a temporary name and renamed
(``artefacts``), checkpoints likewise (orbax), and the metrics writer opens
rewound to the latest checkpoint (rows of later steps are redone by the loop).
"""

import dataclasses
import json
import pathlib
import time
from typing import Any

from pau_jax import metrics_writer, parallel
from pau_jax.models import lora, quantization
from pau_jax.policy import backends
from pau_jax.policy.config import DEFAULT_PREFIX_CACHE_GIB, check_decode_weights
from pau_jax.training import artefacts
from pau_jax.training import checkpoint as checkpoint_lib
from pau_jax.training import step as step_lib


@dataclasses.dataclass(frozen=True, kw_only=True)
class ActorConfig:
    """The trained model: a checkpoint (or a random model) and its LoRA adapters.

    Attributes:
      checkpoint: a Hugging Face directory (any family of ``pau_jax.models.load_hf``);
        None builds a random model from ``model_config`` and writes it (with the
        offline tokenizer) to <run_dir>/base_model.
      model_config: the config of the random model (any family's config class).
      tokenizer: a tokenizer path or 'qwen3-offline'; default the checkpoint's own.
      dtype: parameter dtype of the base weights.
      lora_rank, lora_alpha, lora_targets: the adapters (paper: 16, 16, all linear).
      decode_weights: what the actor's (and a 'self' critic's) decode steps read:
        'float32' or 'q8' (an 8-bit copy of the frozen base, `models.quantization`; the
        adapters stay float32 on top; the learner scores in float32 and corrects for the
        difference, `rl.grpo.GRPOConfig.sampler_correction`).
    """

    checkpoint: str | None = None
    model_config: Any = None
    tokenizer: str | None = None
    dtype: str = "float32"
    lora_rank: int = 16
    lora_alpha: float = 16.0
    lora_targets: tuple[str, ...] = tuple(lora.DEFAULT_TARGETS)
    decode_weights: str = "float32"

    def __post_init__(self):
        check_decode_weights("ActorConfig", self.decode_weights)


def _base_checkpoint(out: pathlib.Path, actor: ActorConfig, seed: int, tag: str) -> pathlib.Path:
    if actor.checkpoint is not None:
        return pathlib.Path(actor.checkpoint).expanduser()
    if actor.model_config is None:
        raise ValueError(
            "the actor needs checkpoint= (an HF dir) or model_config= (a random model) "
            "(gin: --gin.CHECKPOINT=\"'/path'\")"
        )
    path = out / "base_model"
    if parallel.is_primary():
        artefacts.random_base_model(path, actor.model_config, seed=seed, tag=tag)
    parallel.barrier("base_model")
    return path


class Run:
    """An open training run: its directory, actor, mesh, checkpointer and metrics writer.

    Attributes:
      out: the run directory.
      mesh: the device mesh, or None.
      model: the actor (learner layout) with LoRA adapters.
      tokenizer: its tokenizer.
      base_path: the base checkpoint directory.
      n_adapted: modules that carry adapters.
      checkpointer: ``checkpoint.Checkpointer`` of <run_dir>/checkpoints.
      writer: ``metrics_writer.MetricsWriter`` of the run directory.
      primary: whether this process writes files.
    """

    def __init__(
        self,
        run_dir: str,
        actor: ActorConfig,
        *,
        seed: int = 0,
        mesh_config: parallel.MeshConfig | None = None,
        max_checkpoints: int | None = 3,
        tag: str = "train",
    ):
        from pau_jax import models
        from pau_jax.tokenizer import load_tokenizer

        self.tag = tag
        self.started = time.perf_counter()
        self.out = pathlib.Path(run_dir)
        self.out.mkdir(parents=True, exist_ok=True)
        self.primary = parallel.is_primary()
        self.mesh = parallel.make_mesh(mesh_config) if mesh_config is not None else None
        path = _base_checkpoint(self.out, actor, seed, tag)
        self.model, _ = models.load_hf(
            path, dtype=actor.dtype, mesh=self.mesh, rules=parallel.LEARNER_RULES
        )
        self.tokenizer = load_tokenizer(actor.tokenizer or path)
        self.base_path = str(path)
        self.n_adapted = lora.apply_lora(
            self.model,
            rank=actor.lora_rank,
            alpha=actor.lora_alpha,
            targets=actor.lora_targets,
            seed=seed,
        )
        if actor.decode_weights != "float32":
            n = quantization.quantize_for_decode(self.model, actor.decode_weights)
            print(f"[{tag}] decode_weights={actor.decode_weights}: {n} matrices", flush=True)
        if self.mesh is not None:
            parallel.shard_model(self.model, self.mesh)
        self.relayout = self.mesh is not None and parallel.layouts_differ(self.model, self.mesh)
        mesh_text = "" if self.mesh is None else f"; mesh {dict(self.mesh.shape)}"
        print(
            f"[{tag}] base model {path}; LoRA on {self.n_adapted} modules{mesh_text}"
            + (f" (relayout {self.relayout})" if self.mesh is not None else ""),
            flush=True,
        )
        self.checkpointer = checkpoint_lib.Checkpointer(
            self.out / "checkpoints", max_to_keep=max_checkpoints
        )
        # Rows of steps after the latest checkpoint belong to a stopped process; they are redone.
        self.writer = metrics_writer.MetricsWriter(
            self.out, resume_step=self.checkpointer.latest_step() or 0
        )

    def to_layout(self, rules) -> float:
        """Moves the actor into a layout (sampler or learner rules); seconds, 0 without a mesh."""
        return parallel.reshard(self.model, self.mesh, rules) if self.relayout else 0.0

    def base_policy(self, sampling, *, prefix_cache_gib: float = DEFAULT_PREFIX_CACHE_GIB):
        """The base model (same arrays, adapters zeroed, no copy) as a ``LocalPolicy``.

        Its prefix cache holds ``prefix_cache_gib`` GiB (``policy.backends.prefix_cache``; 0: none).
        """
        from pau_jax.policy.local import LocalPolicy

        model = step_lib.reference_model(self.model)
        cache = backends.prefix_cache(prefix_cache_gib)
        return LocalPolicy(model, self.tokenizer, sampling, prefix_cache=cache)

    def export_adapter(self) -> pathlib.Path:
        """Exports the model's adapters as it holds them (PEFT) to <run_dir>/adapter, atomically.

        Only the primary process writes. A loop that keeps its best adapter so far calls
        this with the best one synced into the model (``training.step.sync_model``).

        Returns:
          The adapter folder.
        """
        path = self.out / "adapter"
        if self.primary:
            artefacts.replace_dir(
                path,
                lambda tmp: lora.export_peft(
                    self.model, tmp, base_model_name_or_path=self.base_path
                ),
            )
        return path

    def close(self) -> None:
        """Closes the checkpointer (waiting for saves in progress) and the metrics writer.

        ``finish`` does this itself; a run mode that writes its own summary calls it instead.
        """
        self.checkpointer.close()
        self.writer.close()

    def finish(self, summary: dict) -> dict:
        """Closes the files, exports the adapters (PEFT) and writes summary.json, each atomically."""
        self.close()
        summary = {**summary, "lora_modules": self.n_adapted}
        summary["seconds"] = round(time.perf_counter() - self.started, 2)
        if self.primary:
            self.export_adapter()
            artefacts.replace_text(self.out / "summary.json", json.dumps(summary, indent=2) + "\n")
        print(
            f"[{self.tag}] done: {summary.get('steps')} steps; adapter: {self.out / 'adapter'}",
            flush=True,
        )
        return summary

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        if exc[0] is not None:  # Keep what was written; finish() was not reached.
            self.close()
        return False


def open_run(
    run_dir: str,
    actor: ActorConfig,
    *,
    seed: int = 0,
    mesh_config: parallel.MeshConfig | None = None,
    max_checkpoints: int | None = 3,
    tag: str = "train",
) -> Run:
    """Opens a training run (``with open_run(run_dir, actor, seed=...) as r: ...``).

    Args:
      run_dir: the run directory (created; an existing one is resumed).
      actor: the trained model and its adapters.
      seed: the seed of a random base model and of the adapters' initialisation.
      mesh_config: a device mesh; None runs on the default device.
      max_checkpoints: checkpoints kept; None keeps all.
      tag: the run mode's label in progress lines and in the random base model.

    Returns:
      The open ``Run``; it is its own context manager.
    """
    return Run(
        run_dir,
        actor,
        seed=seed,
        mesh_config=mesh_config,
        max_checkpoints=max_checkpoints,
        tag=tag,
    )
