"""Supervised fine-tuning of LoRA adapters on recorded trajectories (DISTILL, CodeARC-SFT).

``trainer`` turns episode records into (prompt, completion) token pairs and
trains on their masked token NLL; ``teacher`` wraps a policy so that it sees the
gold description of the task while the recorded prompts stay the agent's own;
``distill`` is the distillation run mode (teacher episodes, then training).
"""
