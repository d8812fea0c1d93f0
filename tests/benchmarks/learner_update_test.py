"""benchmarks/learner_update.py: its layouts hold the same episodes, and a tiny run prints its ratio."""

import argparse
import importlib.util
import pathlib
import subprocess
import sys

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "learner_update.py"


def _load():
    spec = importlib.util.spec_from_file_location("learner_update", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


bench = _load()
ARGS = argparse.Namespace(
    seed=0,
    episodes=3,
    phases=7,
    first_prompt=40,
    reply_min=3,
    reply_max=9,
    appended=6,
    micro_batch_size=2,
    pad_to_multiple=8,
)


def test_the_layouts_hold_the_same_sampled_tokens():
    episodes, advantages = bench.make_episodes(ARGS, vocab=64)
    assert [len(e) for e in episodes] == [7, 7, 7]
    layouts = bench.layouts(episodes, advantages, ARGS)
    replies = sum(len(r.token_ids) for e in episodes for r in e)
    for name, batches in layouts.items():
        micro = bench._micro(batches, ARGS.micro_batch_size)
        assert sum(float(np.asarray(b.loss_mask).sum()) for b in micro) == replies, name
    rows = layouts["one row per episode, length buckets, loss columns scored"]
    real = sum(int(np.asarray(b.attention_mask).sum()) for b in rows)
    assert real == sum(len(e[-1].prompt_ids) + len(e[-1].token_ids) for e in episodes)
    # The scored layout lists every loss column; the layouts before it score every column.
    assert all(b.score_positions is not None for b in rows)
    every = layouts["one row per episode, length buckets, every column scored"]
    assert all(b.score_positions is None for b in every)
    for b in rows:
        positions, mask = np.asarray(b.score_positions), np.asarray(b.loss_mask)
        assert int((positions > 0).sum()) == int(mask.sum())


def test_a_tiny_run_prints_its_ratio_last():
    argv = [sys.executable, str(SCRIPT), "--episodes", "2", "--phases", "3", "--first_prompt", "32"]
    argv += ["--reply_min", "4", "--reply_max", "8", "--appended", "6", "--repeats", "1"]
    argv += ["--pad_to_multiple", "16", "--micro_batch_size", "2"]
    out = subprocess.run(argv, capture_output=True, text=True, check=True, timeout=600).stdout
    assert out.strip().splitlines()[-1].startswith("speedup=")
    assert "| one row per episode, length buckets, loss columns scored | 2 |" in out
    assert "| one row per episode, length buckets, every column scored | 2 |" in out


def test_chosen_layouts_with_remat():
    argv = [sys.executable, str(SCRIPT), "--episodes", "2", "--phases", "3", "--first_prompt", "32"]
    argv += ["--reply_min", "4", "--reply_max", "8", "--appended", "6", "--repeats", "1"]
    argv += ["--pad_to_multiple", "16", "--micro_batch_size", "2", "--remat"]
    argv += ["--layouts", "phase_buckets", "episode"]
    out = subprocess.run(argv, capture_output=True, text=True, check=True, timeout=600).stdout
    assert "remat True" in out
    assert "| per-phase rows, one batch |" not in out
    assert "| per-phase rows, length buckets |" in out
    last = out.strip().splitlines()[-1]
    assert last.startswith("speedup=") and "(per-phase rows, length buckets " in last
