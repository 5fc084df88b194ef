"""Training: loss, optimizer and schedules, the loop (trainer.py), checkpoints, logging.

The entry point is `nmt.training.trainer.Trainer(cfg).run()`; nothing is imported here so
that `import nmt.training.config` stays cheap.
"""
