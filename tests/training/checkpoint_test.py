"""Checkpointer: bit-exact round trips, resume in a fresh process, crash safety, clear mismatches.

Run as a script (``python checkpoint_test.py resume DIR OUT`` or ``crash DIR``), this
file is also the fresh process that resumes from, or dies while writing, a checkpoint.
"""

import os
import subprocess
import sys

import jax
import numpy as np
import pytest
from flax import nnx

from pau_jax.models import lora, qwen3
from pau_jax.rl import learner
from pau_jax.rl.samples import Sample, make_batch
from pau_jax.training import checkpoint

TINY = qwen3.Qwen3Config(
    vocab_size=64,
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=1,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=8,
    rms_norm_eps=1e-6,
    rope_theta=10000.0,
    tie_word_embeddings=False,
    max_position_embeddings=64,
)
CONFIG = learner.LearnerConfig(learning_rate=1e-2, micro_batch_size=2)


def _model(rank: int = 4):
    model = qwen3.Qwen3ForCausalLM(TINY, rngs=nnx.Rngs(0))
    lora.apply_lora(model, rank=rank, alpha=8, seed=1)
    rng = np.random.default_rng(2)
    for adapter in lora.adapters(model).values():
        adapter.lora_b.set_value(0.2 * rng.standard_normal(adapter.lora_b.shape, np.float32))
    return model


def _batch(position: int):
    """The data at a position of the stream: 4 samples drawn from a seeded generator."""
    rng = np.random.default_rng(100 + position)
    samples = []
    for _ in range(4):
        prompt = rng.integers(1, TINY.vocab_size, rng.integers(2, 7)).tolist()
        completion = rng.integers(1, TINY.vocab_size, rng.integers(1, 5)).tolist()
        samples.append(
            Sample(
                prompt_ids=prompt,
                completion_ids=completion,
                sampler_logprobs=(-rng.uniform(3.5, 4.5, len(completion))).tolist(),
                advantage=float(rng.standard_normal()),
            )
        )
    return make_batch(samples)


def _leaves(state) -> list[np.ndarray]:
    return [np.asarray(x) for x in jax.tree.leaves(state)]


def _assert_bit_equal(a, b):
    la, lb = _leaves(a), _leaves(b)
    assert jax.tree.structure(a) == jax.tree.structure(b)
    assert len(la) == len(lb)
    for x, y in zip(la, lb):
        assert x.dtype == y.dtype and x.shape == y.shape
        np.testing.assert_array_equal(x, y)


def _spawn(*args, timeout=120):
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    return subprocess.run(
        [sys.executable, __file__, *map(str, args)],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_round_trip_is_bit_exact_for_concrete_and_abstract_targets(tmp_path):
    model = _model()
    step_fn = learner.make_train_step(model, CONFIG)
    state, _ = step_fn(learner.init_state(model, CONFIG), _batch(0))
    expected = jax.device_get(state)
    extra = {"rng": [1, 2, 3], "position": 1, "fingerprint": "abc"}
    with checkpoint.Checkpointer(tmp_path) as ckpt:
        ckpt.save(1, state, extra=extra)
        assert ckpt.latest_step() == 1
    ckpt = checkpoint.Checkpointer(tmp_path)
    concrete = learner.init_state(_model(), CONFIG)
    abstract = jax.eval_shape(lambda: learner.init_state(_model(), CONFIG))
    for target in (concrete, abstract):
        restored, got_extra = ckpt.restore(1, target)
        assert got_extra == extra
        _assert_bit_equal(restored, expected)
        assert int(restored.step) == 1
        # The optimizer moments really are part of it (not zeros).
        mu = restored.opt_state[1][0].mu
        assert any(np.abs(np.asarray(x)).max() > 0 for x in jax.tree.leaves(mu))
    ckpt.close()


def test_resume_in_a_fresh_process_matches_an_uninterrupted_run(tmp_path):
    model = _model()
    step_fn = learner.make_train_step(model, CONFIG)
    state = learner.init_state(model, CONFIG)
    losses = []
    ckpt = checkpoint.Checkpointer(tmp_path)
    for position in range(3):
        state, metrics = step_fn(state, _batch(position))
        losses.append(float(metrics["train/loss"]))
        if position == 1:
            key = jax.random.key_data(jax.random.key(7))
            # The next step donates `state` while the save still writes in the background.
            ckpt.save(2, state, extra={"rng": np.asarray(key).tolist(), "position": 2})
    ckpt.close()
    out = tmp_path / "resumed.npz"
    result = _spawn("resume", tmp_path, out)
    assert result.returncode == 0, result.stderr[-3000:]
    resumed = np.load(out)
    print(f"uninterrupted step-3 loss {losses[2]!r}, resumed {float(resumed['loss'])!r}")
    assert float(resumed["loss"]) == losses[2]
    assert int(resumed["step"]) == 3
    final = _leaves(state.lora)
    assert len(final) == len(resumed.files) - 2
    for i, leaf in enumerate(final):
        np.testing.assert_array_equal(resumed[f"lora_{i}"], leaf)


def _resume(directory: str, out: str) -> None:
    """Fresh objects: restore the latest step into an abstract target and take one step."""
    ckpt = checkpoint.Checkpointer(directory)
    step = ckpt.latest_step()
    model = _model()
    target = jax.eval_shape(lambda: learner.init_state(model, CONFIG))
    state, extra = ckpt.restore(step, target)
    assert extra["rng"] == np.asarray(jax.random.key_data(jax.random.key(7))).tolist()
    state, metrics = learner.make_train_step(model, CONFIG)(state, _batch(extra["position"]))
    arrays = {f"lora_{i}": leaf for i, leaf in enumerate(_leaves(state.lora))}
    np.savez(out, loss=np.asarray(metrics["train/loss"]), step=np.asarray(state.step), **arrays)
    ckpt.close()


def _crash(directory: str) -> None:
    """Saves step 1, then dies inside the save of step 2 just before its final rename."""
    from orbax.checkpoint._src.path import atomicity

    model = _model()
    state = learner.init_state(model, CONFIG)
    ckpt = checkpoint.Checkpointer(directory)
    ckpt.save(1, state, extra={"position": 1})
    ckpt.wait()

    async def die(self):
        os._exit(17)

    atomicity.AtomicRenameTemporaryPath.finalize = die
    ckpt.save(2, state, extra={"position": 2})
    ckpt.wait()
    sys.exit(0)


def test_a_crash_during_a_save_leaves_the_previous_checkpoint_usable(tmp_path):
    result = _spawn("crash", tmp_path)
    assert result.returncode == 17, result.stderr[-3000:]
    leftovers = sorted(p.name for p in tmp_path.iterdir())
    assert any(name.startswith("2.") for name in leftovers), leftovers  # half-written step 2
    ckpt = checkpoint.Checkpointer(tmp_path)
    assert ckpt.latest_step() == 1
    state, extra = ckpt.restore(1, learner.init_state(_model(), CONFIG))
    assert extra == {"position": 1}
    _assert_bit_equal(state, learner.init_state(_model(), CONFIG))
    ckpt.save(2, state, extra={"position": 2})  # the step can be written again
    assert ckpt.latest_step() == 2
    ckpt.close()
    # The half-written directory is gone (orbax removes it when the directory is opened).
    assert sorted(p.name for p in tmp_path.iterdir()) == ["1", "2"]


def test_mismatches_and_misuse_fail_clearly(tmp_path):
    state = learner.init_state(_model(rank=4), CONFIG)
    ckpt = checkpoint.Checkpointer(tmp_path, max_to_keep=2)
    ckpt.save(0, state, extra={})
    with pytest.raises(ValueError, match="already holds step 0"):
        ckpt.save(0, state, extra={})
    with pytest.raises(ValueError, match="not JSON-serialisable"):
        ckpt.save(1, state, extra={"key": np.zeros(2)})
    with pytest.raises(ValueError, match=r"has no step 5; it has \[0\]"):
        ckpt.restore(5, state)
    other_rank = learner.init_state(_model(rank=2), CONFIG)
    with pytest.raises(ValueError, match="does not match the train state.*another shape"):
        ckpt.restore(0, other_rank)
    plain_adam = learner.init_state(_model(rank=4), learner.LearnerConfig(max_grad_norm=1.0))
    small = qwen3.Qwen3ForCausalLM(TINY, rngs=nnx.Rngs(0))
    lora.apply_lora(small, rank=4, alpha=8, targets=("q_proj",))
    with pytest.raises(ValueError, match="arrays missing|unexpected arrays"):
        ckpt.restore(0, learner.init_state(small, CONFIG))
    assert ckpt.restore(0, plain_adam)[1] == {}
    for step in (1, 2, 3):
        ckpt.save(step, state, extra={})
    ckpt.wait()
    assert ckpt.all_steps() == [2, 3]
    ckpt.close()
    with pytest.raises(ValueError, match="max_to_keep"):
        checkpoint.Checkpointer(tmp_path, max_to_keep=0)


if __name__ == "__main__":
    command, *arguments = sys.argv[1:]
    {"resume": _resume, "crash": _crash}[command](*arguments)
