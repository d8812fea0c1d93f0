"""A tiny AAC run (the settings of the resume tests), also runnable as its own process.

    PAU_JAX_COMPILATION_CACHE=DIR python tests/rl/tiny_training.py RUN_DIR STEPS [BASE_CHECKPOINT]

trains ``STEPS`` steps into ``RUN_DIR``, with a checkpoint every 2 steps, from
``BASE_CHECKPOINT`` or (without one) a random base model written to
``RUN_DIR/base_model``; compiled programs are kept in DIR, so that a later
process skips most compilation. The kill tests start it with a fresh
interpreter (a process that has imported JAX must not fork) and ``kill -9`` it.
"""

import os
import pathlib
import signal
import subprocess
import sys
import time

import checkpoints

from pau_jax.env.episode import EpisodeConfig
from pau_jax.policy.config import SamplingConfig
from pau_jax.rl import loop
from pau_jax.rl.critic import CriticConfig
from pau_jax.rl.learner import LearnerConfig
from pau_jax.rl.rewards import RewardConfig
from pau_jax.rl.rollout import RolloutConfig
from pau_jax.training.run import ActorConfig

SEED = 3
CHECKPOINT_EVERY = 2
TESTS = pathlib.Path(__file__).resolve().parents[1]


def settings(base: str | None = None) -> dict:
    """``loop.train`` arguments (all but ``run_dir`` and ``steps``) of a few-second step."""
    if base is None:
        actor = ActorConfig(
            model_config=checkpoints.tiny_qwen3_config(), lora_rank=2, lora_alpha=2.0
        )
    else:
        actor = ActorConfig(checkpoint=base, lora_rank=2, lora_alpha=2.0)
    return dict(
        actor=actor,
        seed=SEED,
        episode_config=EpisodeConfig(call_budget=1, max_steps=2),
        reward_config=RewardConfig(max_steps=2, reasoning_tau=2, input_tau=2, reflection_tau=2),
        rollout_config=RolloutConfig(
            tasks_per_batch=1,
            group_size=2,
            sampling=SamplingConfig(max_new_tokens=8, temperature=1.0),
        ),
        critic_config=CriticConfig(sampling=SamplingConfig(max_new_tokens=4)),
        learner_config=LearnerConfig(learning_rate=1e-2, logits_chunk_tokens=256),
        checkpoint_every=CHECKPOINT_EVERY,
        pad_to_multiple=64,
        rows_multiple=2,
        sandbox_workers=1,
    )


def _start(args: list[str], log: pathlib.Path, cache: pathlib.Path) -> subprocess.Popen:
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "PYTHONPATH": os.pathsep.join([str(TESTS.parent), str(TESTS)]),
        "JAX_PLATFORMS": "cpu",
        "PAU_JAX_COMPILATION_CACHE": str(cache),
    }
    with open(log, "w") as out:
        return subprocess.Popen(
            [sys.executable, __file__, *args],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )


def _end(child: subprocess.Popen) -> None:
    """Kills the process if it still runs, and the sandbox workers of its process group."""
    if child.poll() is None:
        os.kill(child.pid, signal.SIGKILL)
        child.wait(timeout=30)
    try:
        os.killpg(child.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def run(args: list[str], *, log: pathlib.Path, cache: pathlib.Path, timeout: float = 240) -> str:
    """Runs this file with ``args`` in a fresh interpreter to the end; its output.

    Raises:
      AssertionError: it failed or took longer than ``timeout``.
    """
    child = _start(args, log, cache)
    try:
        rc = child.wait(timeout=timeout)
    finally:
        _end(child)
    assert rc == 0, f"the run failed (rc {rc}):\n" + log.read_text()[-3000:]
    return log.read_text()


def kill_when(
    args: list[str], ready, *, log: pathlib.Path, cache: pathlib.Path, timeout: float = 240
) -> None:
    """Runs this file with ``args`` in a fresh interpreter and SIGKILLs it once ``ready()``.

    Raises:
      AssertionError: the process ended before ``ready()`` or ``timeout`` passed first.
    """
    child = _start(args, log, cache)
    try:
        deadline = time.monotonic() + timeout
        while not ready():
            if child.poll() is not None:
                raise AssertionError(
                    f"the run ended (rc {child.returncode}) before the kill:\n"
                    + log.read_text()[-3000:]
                )
            if time.monotonic() > deadline:
                raise AssertionError(
                    "the run did not get there in time:\n" + log.read_text()[-3000:]
                )
            time.sleep(0.02)
        os.kill(child.pid, signal.SIGKILL)
        assert child.wait(timeout=30) == -signal.SIGKILL
    finally:
        _end(child)


def main(argv: list[str]) -> None:
    import jax

    jax.config.update("jax_compilation_cache_dir", os.environ["PAU_JAX_COMPILATION_CACHE"])
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    run_dir, steps, *base = argv
    loop.train(run_dir=run_dir, steps=int(steps), **settings(*base))


if __name__ == "__main__":
    main(sys.argv[1:])
