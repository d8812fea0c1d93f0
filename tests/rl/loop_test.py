"""The AAC training loop: seeded task order, resume equal to an uninterrupted run, the gin runs."""

import dataclasses
import fcntl
import http.server
import json
import pathlib
import threading

import checkpoints
import launching
import numpy as np
import pytest
import safetensors.numpy

from pau_jax import parallel, run_claim
from pau_jax.env.episode import EpisodeConfig
from pau_jax.policy import backends
from pau_jax.policy.config import DEFAULT_PREFIX_CACHE_GIB, SamplingConfig
from pau_jax.policy.http import HTTPConfig
from pau_jax.rl import loop, steps
from pau_jax.rl.critic import CriticConfig
from pau_jax.rl.grpo import GRPOConfig
from pau_jax.rl.learner import LearnerConfig
from pau_jax.rl.rewards import RewardConfig
from pau_jax.rl.rollout import RolloutConfig
from pau_jax.training.run import ActorConfig

ROOT = pathlib.Path(__file__).resolve().parents[2]

TINY = dict(
    actor=ActorConfig(
        model_config=checkpoints.tiny_qwen3_config(max_position_embeddings=4096),
        lora_rank=2,
        lora_alpha=2.0,
    ),
    seed=3,
    episode_config=EpisodeConfig(call_budget=2, max_steps=3),
    reward_config=RewardConfig(max_steps=3, reasoning_tau=2, input_tau=2, reflection_tau=2),
    rollout_config=RolloutConfig(
        tasks_per_batch=1, group_size=2, sampling=SamplingConfig(max_new_tokens=8, temperature=1.0)
    ),
    critic_config=CriticConfig(sampling=SamplingConfig(max_new_tokens=4)),
    learner_config=LearnerConfig(learning_rate=1e-2, logits_chunk_tokens=256),
    checkpoint_every=1,
    pad_to_multiple=64,
    rows_multiple=2,
    sandbox_workers=1,
)


def test_task_order_is_seeded_epoch_permutations_and_resumable():
    order = steps.task_order(7, 0, 5, 12)
    assert sorted(order[:5]) == list(range(5)) and sorted(order[5:10]) == list(range(5))
    assert steps.task_order(8, 0, 5, 12) != order
    # Continuing from a saved position gives the same sequence.
    assert steps.task_order(7, 4, 5, 8) == order[4:12]
    assert steps.task_order(7, 0, 5, 12) == order
    with pytest.raises(ValueError, match="no training tasks"):
        steps.task_order(0, 0, 0, 1)


def test_rollout_seeds_of_steps_never_overlap():
    seeds = [steps.rollout_seed(s, k) for s in range(3) for k in range(100)]
    gaps = np.diff(sorted(seeds))
    assert len(set(seeds)) == len(seeds) and gaps.min() >= steps._SEEDS_PER_STEP


def test_critic_seeds_differ_per_step_and_from_the_actor():
    seeds = {steps.critic_seed(s, k) for s in range(3) for k in range(100)}
    actor = {steps.rollout_seed(s, k) + n for s in range(3) for k in range(100) for n in range(50)}
    assert len(seeds) == 300 and not seeds & actor


def test_a_sampling_critic_gets_a_fresh_seed_every_step(tmp_path, monkeypatch):
    seen = []
    collect = steps.rollout_lib.collect

    def spy(*args, critic, **kwargs):
        seen.append(critic.sampling.seed)
        return collect(*args, critic=critic, **kwargs)

    monkeypatch.setattr(steps.rollout_lib, "collect", spy)
    critic = CriticConfig(sampling=SamplingConfig(max_new_tokens=4, temperature=1.0))
    loop.train(run_dir=str(tmp_path), steps=2, **dict(TINY, critic_config=critic))
    assert seen == [steps.critic_seed(TINY["seed"], 0), steps.critic_seed(TINY["seed"], 1)]


class _Rater(http.server.BaseHTTPRequestHandler):
    """A chat endpoint that rates everything 5 and keeps the request bodies."""

    bodies: list = []

    def log_message(self, *args):
        del args

    def do_POST(self):  # noqa: N802
        _Rater.bodies.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
        body = json.dumps({"choices": [{"message": {"content": "Rating: 5"}}]}).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


def _served_critic(url, **http):
    return backends.HTTPBackendConfig(http=HTTPConfig(base_url=url, model="critic", **http))


def test_a_served_critic_gets_the_steps_seed_and_the_critics_sampling(tmp_path):
    # The released critic was a served model sampled at temperature 1 (as_released.gin's
    # critic/SamplingConfig); an endpoint critic is sent that and a fresh seed every step.
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Rater)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    _Rater.bodies = []
    released = CriticConfig(sampling=SamplingConfig(max_new_tokens=300, temperature=1.0))
    url = f"http://127.0.0.1:{httpd.server_address[1]}/v1"
    try:
        loop.train(
            run_dir=str(tmp_path),
            steps=2,
            **dict(TINY, critic=_served_critic(url), critic_config=released),
        )
    finally:
        httpd.shutdown()
        httpd.server_close()
    seeds = [body["seed"] for body in _Rater.bodies]
    first, second = steps.critic_seed(TINY["seed"], 0), steps.critic_seed(TINY["seed"], 1)
    # Every request of step 0 before those of step 1, each step with its own seed.
    assert seeds[0] == first and seeds[-1] == second and seeds == sorted(seeds)
    assert set(seeds) == {first, second}
    assert {(b["temperature"], b["max_tokens"]) for b in _Rater.bodies} == {(1.0, 300)}
    # A seat that sets its own temperature or token budget is refused before anything loads.
    for setting in ({"temperature": 0.5}, {"max_tokens": 64}):
        with pytest.raises(ValueError, match="critic seat's HTTPConfig"):
            loop.train(
                run_dir=str(tmp_path / "refused"),
                **dict(TINY, critic=_served_critic(url, **setting), critic_config=released),
            )
    assert not (tmp_path / "refused").exists()


class _Stop(Exception):
    """Ends a run at its first rollout."""


@pytest.mark.parametrize(("actor_gib", "critic_gib"), [(2**-10, 0.0), (0.0, 2**-9)])
def test_the_prefix_cache_settings_reach_the_actor_and_the_critic(
    tmp_path, monkeypatch, actor_gib, critic_gib
):
    seen = {}

    def spy(*args, actor, critic, **kwargs):
        seen.update(actor=actor.prefix_cache, critic=critic.prefix_cache)
        raise _Stop

    monkeypatch.setattr(steps.rollout_lib, "collect", spy)
    settings = dict(
        TINY,
        rollout_config=dataclasses.replace(TINY["rollout_config"], prefix_cache_gib=actor_gib),
        critic_config=dataclasses.replace(TINY["critic_config"], prefix_cache_gib=critic_gib),
    )
    with pytest.raises(_Stop):
        loop.train(run_dir=str(tmp_path), steps=1, **settings)
    for role, gib in (("actor", actor_gib), ("critic", critic_gib)):
        if gib == 0:
            assert seen[role] is None, role
        else:
            assert seen[role].max_bytes == int(gib * 2**30), role


def test_a_rerun_with_other_settings_or_beside_another_writer_is_refused(tmp_path, monkeypatch):
    def stop(*args, **kwargs):  # Where the run would load its model: the claim comes first.
        raise _Stop

    monkeypatch.setattr(loop.run_lib, "open_run", stop)
    run_dir = tmp_path / "run"
    with pytest.raises(_Stop):
        loop.train(run_dir=str(run_dir), steps=1, **TINY)
    run_dir.mkdir(exist_ok=True)
    (run_dir / "metrics.jsonl").write_text('{"step": 1}\n')  # What that run wrote.
    learner_config = TINY["learner_config"]
    other = dict(TINY, learner_config=dataclasses.replace(learner_config, learning_rate=2e-2))
    with pytest.raises(run_claim.RunDirError) as raised:
        loop.train(run_dir=str(run_dir), steps=1, **other)
    assert "(learner_config.learning_rate: 0.01 -> 0.02)" in str(raised.value)
    assert "\n" not in str(raised.value)
    # Steps to run, micro-batches, cache memory, checkpoints and workers may change: it resumes.
    resumed = dict(
        TINY,
        learner_config=dataclasses.replace(learner_config, micro_batch_size=1),
        rollout_config=dataclasses.replace(TINY["rollout_config"], prefix_cache_gib=0.0),
        checkpoint_every=5,
        sandbox_workers=2,
    )
    with pytest.raises(_Stop):
        loop.train(run_dir=str(run_dir), steps=4, **resumed)
    # A second writer while another process holds the folder.
    with open(run_dir / run_claim.LOCK_FILE) as held:
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        with pytest.raises(run_claim.RunDirError, match=f"^{run_dir} is in use by another run"):
            loop.train(run_dir=str(run_dir), steps=1, **TINY)


def test_one_default_prefix_cache_budget_for_every_local_sampler():
    local = backends.LocalBackendConfig(checkpoint_dir="unused")
    assert (
        RolloutConfig().prefix_cache_gib
        == CriticConfig().prefix_cache_gib
        == local.prefix_cache_gib
        == DEFAULT_PREFIX_CACHE_GIB
    )
    assert backends.prefix_cache().max_bytes == int(DEFAULT_PREFIX_CACHE_GIB * 2**30)
    assert backends.prefix_cache(0) is None
    for make in (RolloutConfig, CriticConfig):
        with pytest.raises(ValueError, match="prefix_cache_gib must be >= 0"):
            make(prefix_cache_gib=-1.0)


def _metrics(run_dir):
    lines = (pathlib.Path(run_dir) / "metrics.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines]


def _adapter(run_dir):
    return safetensors.numpy.load_file(
        str(pathlib.Path(run_dir) / "adapter" / "adapter_model.safetensors")
    )


def test_a_resumed_run_takes_the_same_steps_as_an_uninterrupted_one(tmp_path, capsys):
    whole, split = tmp_path / "whole", tmp_path / "split"
    loop.train(run_dir=str(whole), steps=2, **TINY)
    first = loop.train(run_dir=str(split), steps=1, **TINY)
    assert first["steps"] == 1 and first["data_position"] == 1
    after_one = _adapter(split)
    capsys.readouterr()
    second = loop.train(run_dir=str(split), steps=2, **TINY)
    assert "resuming from step 1 (task position 1)" in capsys.readouterr().out
    assert second["steps"] == 2 and second["data_position"] == 2
    # Step 1 was not redone: one metrics line per step.
    assert [m["step"] for m in _metrics(split)] == [1, 2]
    uninterrupted, resumed = _metrics(whole)[1], _metrics(split)[1]
    for key in ("train/loss", "train/grad_norm", "rollout/reward_mean", "train/tokens"):
        assert resumed[key] == pytest.approx(uninterrupted[key], rel=1e-6, abs=1e-9), key
    assert uninterrupted["train/loss"] != 0.0
    final_whole, final_split = _adapter(whole), _adapter(split)
    assert sorted(final_whole) == sorted(final_split)
    for name in final_whole:
        np.testing.assert_allclose(final_split[name], final_whole[name], atol=1e-7)
    # The second step did move the adapters.
    assert any(not np.array_equal(after_one[n], final_split[n]) for n in final_split)
    assert sorted(p.name for p in (split / "checkpoints").iterdir()) == ["1", "2"]
    # A finished run resumed again has nothing left to do.
    assert loop.train(run_dir=str(split), steps=2, **TINY)["steps"] == 2
    assert len(_metrics(split)) == 2
    with pytest.raises(run_claim.RunDirError, match="seed: 3 -> 4"):
        loop.train(run_dir=str(split), steps=3, **dict(TINY, seed=4))


def test_a_learning_rate_0_control_runs_no_update(tmp_path, capsys):
    """At learning rate 0 the policy cannot move: no update runs and none is logged."""
    frozen = dataclasses.replace(TINY["learner_config"], learning_rate=0.0)
    summary = loop.train(
        run_dir=str(tmp_path / "control"), steps=2, **dict(TINY, learner_config=frozen)
    )
    assert summary["steps"] == 2
    assert capsys.readouterr().out.count("no update (lr 0)") == 2
    rows = _metrics(tmp_path / "control")
    assert [m["step"] for m in rows] == [1, 2]
    for m in rows:
        assert "rollout/reward_mean" in m
        assert not [k for k in m if k.startswith(("train/", "grpo/"))], sorted(m)
    # The exported adapters are the initial ones: B is zero, so the policy is the base.
    adapter = _adapter(tmp_path / "control")
    assert [n for n in adapter if "lora_B" in n]
    assert all(not np.any(w) for n, w in adapter.items() if "lora_B" in n)


OVERLAYS = ("ablations/final.gin", "ablations/sym_info.gin")


def test_every_aac_gin_combination_parses(tmp_path):
    for extra in ((), *((o,) for o in OVERLAYS)):
        files = ["aac.gin", *extra, "debug/local_tiny.gin"]
        proc = launching.launch(*(f"--gin_file={f}" for f in files), "--dry_run", cwd=tmp_path)
        assert proc.returncode == 0, proc.stderr[-2000:]
        out = proc.stdout
        assert "train.steps = 2" in out and "EpisodeConfig.max_steps = %T_MAX" in out
        if "final" in "".join(extra):
            assert "advantage_fn = @pau_jax.rl.credit.final_only" in out
        if "sym_info" in "".join(extra):
            assert "CriticConfig.privileged = 'none'" in out
    # The paper defaults with nothing overlaid (and a checkpoint and a built split to read).
    inputs = launching.dry_run_inputs(tmp_path)
    proc = launching.launch("--gin_file=aac.gin", *inputs, "--dry_run", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert (
        "T_MAX = 40" in proc.stdout
        and "advantage_fn = @pau_jax.rl.credit.final_plus_mean" in proc.stdout
    )


@pytest.mark.slow
def test_launch_aac_tiny_end_to_end(tmp_path):
    run_dir = tmp_path / "run"
    proc = launching.launch(
        "--gin_file=aac.gin",
        "--gin_file=debug/local_tiny.gin",
        f"--run_dir={run_dir}",
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == ["1", "2"]
    metrics = _metrics(run_dir)
    assert [m["step"] for m in metrics] == [1, 2]
    for m in metrics:
        assert np.isfinite(m["train/loss"]) and m["rollout/episodes"] == 4.0
        assert m["rollout/steps_per_episode"] <= 3.0 and m["critic/requested"] >= 4.0
    peft = json.loads((run_dir / "adapter" / "adapter_config.json").read_text())
    assert peft["r"] == 4 and len(peft["target_modules"]) == 7
    assert (run_dir / "adapter" / "adapter_model.safetensors").exists()
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["steps"] == 2
    assert (
        summary["credit"].startswith("final_plus_mean") and "pau_jax's reading" in summary["credit"]
    )
    assert (
        "advantage_fn = @pau_jax.rl.credit.final_plus_mean" in (run_dir / "config.gin").read_text()
    )
    assert list(run_dir.glob("events.out.tfevents.*"))


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_each_ablation_runs_one_tiny_step(overlay, tmp_path):
    run_dir = tmp_path / "run"
    proc = launching.launch(
        "--gin_file=aac.gin",
        f"--gin_file={overlay}",
        "--gin_file=debug/local_tiny.gin",
        "--gin.pau_jax.experiment.train.steps=1",
        f"--run_dir={run_dir}",
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert [m["step"] for m in _metrics(run_dir)] == [1]
    operative = (run_dir / "operative_config.gin").read_text()
    if "final" in overlay:
        assert "@pau_jax.rl.credit.final_only" in operative
    else:
        assert "privileged = 'none'" in operative


def test_temperature_and_t_max_are_one_setting_each(tmp_path):
    # The learner's temperature comes from the rollout, the rewards' T_max from the protocol:
    # a different explicit value is refused instead of silently training off-policy.
    learner_config = LearnerConfig(grpo=GRPOConfig(temperature=0.5))
    with pytest.raises(ValueError, match="GRPOConfig.temperature=0.5 differs from the run's 0.7"):
        loop.train(
            run_dir=str(tmp_path),
            **dict(
                TINY,
                rollout_config=RolloutConfig(sampling=SamplingConfig(temperature=0.7)),
                learner_config=learner_config,
            ),
        )
    with pytest.raises(ValueError, match="RewardConfig.max_steps=5 differs from the run's 3"):
        loop.train(run_dir=str(tmp_path), **dict(TINY, reward_config=RewardConfig(max_steps=5)))
    assert loop._from_run("x", GRPOConfig(), "temperature", 0.7) == 0.7
    assert loop._from_run("x", RewardConfig(), "max_steps", 3) == 3


def test_bad_critic_and_missing_step_limit_fail_before_loading_anything(tmp_path):
    run_dir = tmp_path / "run"
    with pytest.raises(ValueError, match="critic must be 'self'"):
        loop.train(run_dir=str(run_dir), **dict(TINY, critic=None))
    no_limit = EpisodeConfig(call_budget=2, max_steps=None)
    with pytest.raises(ValueError, match="needs a step limit"):
        loop.train(run_dir=str(run_dir), **dict(TINY, episode_config=no_limit))
    assert not run_dir.exists()  # Refused before the run directory or the model existed.


def test_8_bit_decode_weights_train_on_a_one_device_mesh(tmp_path):
    # A gin run binds a mesh (one device on a CPU): the sampler's 8-bit copies must not stop
    # the model's placement on it (they are not laid out by logical axes).
    actor = dataclasses.replace(TINY["actor"], decode_weights="q8")
    result = loop.train(
        run_dir=str(tmp_path / "run"),
        steps=1,
        mesh_config=parallel.MeshConfig(),
        **dict(TINY, actor=actor),
    )
    assert result["steps"] == 1
    metrics = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert np.isfinite(metrics[-1]["train/loss"])
