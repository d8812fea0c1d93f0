"""One tiny step of the AAC loop on a (data, fsdp, tp) mesh of 8 fake CPU devices and on one device.

    XLA_FLAGS=--xla_force_host_platform_device_count=8 python loop_mesh_checks.py OUT_DIR 2,2,2

Prints one JSON line: the metrics of both runs' step and how far their trained adapters differ.
"""

import json
import os
import pathlib
import sys

if "--xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    raise SystemExit("set XLA_FLAGS=--xla_force_host_platform_device_count=8 first")

import jax  # noqa: E402
import numpy as np  # noqa: E402
import safetensors.numpy  # noqa: E402
from flax import nnx  # noqa: E402

from pau_jax import parallel  # noqa: E402
from pau_jax.env.episode import EpisodeConfig  # noqa: E402
from pau_jax.models import qwen3  # noqa: E402
from pau_jax.policy.config import SamplingConfig  # noqa: E402
from pau_jax.rl import loop  # noqa: E402
from pau_jax.rl.critic import CriticConfig  # noqa: E402
from pau_jax.rl.learner import LearnerConfig  # noqa: E402
from pau_jax.rl.rewards import RewardConfig  # noqa: E402
from pau_jax.rl.rollout import RolloutConfig  # noqa: E402
from pau_jax.tokenizer import save_offline_tokenizer  # noqa: E402
from pau_jax.training.run import ActorConfig  # noqa: E402

# Every sharded dimension divides 2: D 32, N*H 32, K*H 32, F 64, V 151936.
CONFIG = qwen3.Qwen3Config(
    vocab_size=151936,
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=1,
    num_attention_heads=2,
    num_key_value_heads=2,
    head_dim=16,
    rms_norm_eps=1e-6,
    rope_theta=1e6,
    tie_word_embeddings=True,
    max_position_embeddings=4096,
)
TINY = dict(
    seed=3,
    episode_config=EpisodeConfig(call_budget=2, max_steps=3),
    reward_config=RewardConfig(max_steps=3, reasoning_tau=2, input_tau=2, reflection_tau=2),
    rollout_config=RolloutConfig(
        tasks_per_batch=2, group_size=2, sampling=SamplingConfig(max_new_tokens=8, temperature=1.0)
    ),
    critic_config=CriticConfig(sampling=SamplingConfig(max_new_tokens=4)),
    learner_config=LearnerConfig(learning_rate=1e-2, logits_chunk_tokens=256),
    steps=1,
    pad_to_multiple=64,
    rows_multiple=4,
    sandbox_workers=1,
)


def write_checkpoint(path: pathlib.Path) -> None:
    """The random base model both runs load, as a Hugging Face directory."""
    qwen3.save_hf(qwen3.Qwen3ForCausalLM(CONFIG, rngs=nnx.Rngs(3)), CONFIG, path)
    save_offline_tokenizer(path)


def run(run_dir: pathlib.Path, checkpoint: pathlib.Path, mesh_config) -> dict:
    summary = loop.train(
        run_dir=str(run_dir),
        actor=ActorConfig(checkpoint=str(checkpoint), lora_rank=2, lora_alpha=2.0),
        mesh_config=mesh_config,
        **TINY,
    )
    adapter = safetensors.numpy.load_file(str(run_dir / "adapter" / "adapter_model.safetensors"))
    return {"metrics": summary["last_metrics"], "adapter": adapter}


def main(out: pathlib.Path, shape: str) -> None:
    data, fsdp, tp = (int(v) for v in shape.split(","))
    mesh_config = parallel.MeshConfig(data=data, fsdp=fsdp, tp=tp)
    write_checkpoint(out / "base")
    single = run(out / "single", out / "base", None)
    sharded = run(out / "mesh", out / "base", mesh_config)
    diff = max(
        float(np.abs(single["adapter"][k] - sharded["adapter"][k]).max()) for k in single["adapter"]
    )
    change = max(float(np.abs(v).max()) for k, v in single["adapter"].items() if "lora_B" in k)
    result = {
        "devices": jax.device_count(),
        "single": single["metrics"],
        "mesh": sharded["metrics"],
        "max_adapter_diff": diff,
        "max_lora_b": change,
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main(pathlib.Path(sys.argv[1]), sys.argv[2])
