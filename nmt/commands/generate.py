"""nmt-generate: translate raw text (a file or stdin) or a binarized split with one
checkpoint or an ensemble, or score given translations (score_reference=true); the work
is nmt.generation.job.generate."""

from __future__ import annotations

from nmt.generation.config import GenerateConfig
from nmt.generation.job import generate


def run(cfg: GenerateConfig) -> int:
    return generate(cfg)
