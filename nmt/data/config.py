from dataclasses import dataclass, field
from typing import Optional

@dataclass
class SpmConfig:
    vocab_size: int = 8000
    model_type: str = "unigram"

@dataclass
class PreprocessConfig:
    src: str = "en"
    tgt: str = "de"
    workers: int = 1
    out: Optional[str] = None
    debug: bool = False
    spm: SpmConfig = field(default_factory=SpmConfig)
