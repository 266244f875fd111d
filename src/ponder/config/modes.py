"""The modes' defaults and caps (:class:`ModeConfig`), the priorities, and the model
names the OpenAI-compatible routes serve."""

from __future__ import annotations

from pydantic import (
    BaseModel,
    Field,
    field_validator,
)

from ponder.types import Mode, ReasoningPath

__all__ = [
    "AUTO_TARGET",
    "AUTO_VOTE_TARGET",
    "NUM_PRIORITIES",
    "SERVED_MODELS",
    "ModeConfig",
    "default_modes",
]

NUM_PRIORITIES = 6


#: auto mode's default target_confidence, the calibrated confidence at which its first
#: stages end, and its vote_target, the stop rule's target in stage 3 (chosen on the
#: quality benchmark's fit half: bench/results/quality.md)
AUTO_TARGET = 0.6
AUTO_VOTE_TARGET = 0.5

#: the model names the OpenAI-compatible routes serve (``GET /v1/models``): ``ponder``
#: (the standard mode) and one per mode
SERVED_MODELS = ("ponder", *(f"ponder-{mode.value}" for mode in Mode))


class ModeConfig(BaseModel):
    """Defaults and caps of one mode."""

    samples: int = Field(ge=1, description="samples run by default")
    max_samples: int = Field(ge=1, description="the most samples a request may ask for")
    temperature: float = Field(ge=0.0, le=2.0, description="sampling temperature by default")
    max_temperature: float = Field(default=1.5, ge=0.0, le=2.0)
    max_new_tokens: int = Field(ge=1, description="tokens per sample by default")
    max_max_new_tokens: int = Field(ge=1, description="the most tokens a request may ask for")
    sample_timeout_s: float = Field(gt=0, description="one sample's time limit")
    task_timeout_s: float = Field(gt=0, description="the whole task's time limit")
    max_timeout_s: float = Field(gt=0, description="the most timeout_s a request may ask for")
    early_stop: bool = Field(
        default=False, description="stop sampling once the vote is decided (skipped samples)"
    )
    target_confidence: float = Field(
        default=0.8,
        gt=0,
        le=1,
        description="early stop: the probability that the leading answer stays the leader "
        "(auto mode: also the calibrated confidence that ends its first stages)",
    )
    vote_target: float | None = Field(
        default=None,
        gt=0,
        le=1,
        description="auto mode: the stop rule's target over deep's plan (stage 3), where "
        "target_confidence ends stages 1 and 2; None: target_confidence",
    )
    paths: list[ReasoningPath] = Field(
        default_factory=lambda: [ReasoningPath.cot],
        description="reasoning paths the samples are spread over: cot, decompose, pot",
    )
    progressive: bool = Field(
        default=False,
        description="first sample at a promoted priority (deep mode)",
    )
    clarify: bool = Field(
        default=False, description="ask a clarifying question when the paths disagree"
    )
    preliminary: bool = Field(
        default=True,
        description="give preliminary (anytime) answers while samples run: the greedy first "
        "sample's answer at once, then the vote so far",
    )
    cascade: bool = Field(
        default=False,
        description="run the plan as auto's cascade: one greedy sample, then a second "
        "path, then the rest, each stage only while the answer is below the target",
    )

    def temperature_for(self, samples: int) -> float:
        """Temperatures fall slightly as N grows: -4% per sample beyond 3, at most -40%."""
        return round(self.temperature * max(0.6, 1 - 0.04 * max(0, samples - 3)), 4)

    @field_validator("paths")
    @classmethod
    def _check_paths(cls, value: list[ReasoningPath]) -> list[ReasoningPath]:
        if not value:  # a value that is no ReasoningPath fails before this
            raise ValueError(f"paths must be a non-empty list of cot, decompose, pot; got {value}")
        return value


def default_modes() -> dict[Mode, ModeConfig]:
    return {
        Mode.fast: ModeConfig(
            samples=1, max_samples=1, temperature=0.3, max_new_tokens=512,
            max_max_new_tokens=2048, sample_timeout_s=60, task_timeout_s=300, max_timeout_s=600,
            preliminary=False,
        ),
        Mode.standard: ModeConfig(
            samples=3, max_samples=8, temperature=0.5, max_new_tokens=1024,
            max_max_new_tokens=2048, sample_timeout_s=60, task_timeout_s=300, max_timeout_s=600,
            early_stop=True,
        ),
        Mode.deep: ModeConfig(
            samples=5, max_samples=12, temperature=0.4, max_new_tokens=2048,
            max_max_new_tokens=4096, sample_timeout_s=90, task_timeout_s=420, max_timeout_s=900,
            early_stop=True, paths=[ReasoningPath.cot, ReasoningPath.pot, ReasoningPath.decompose],
            progressive=True, clarify=True,
        ),
        # the cascade's plan is deep's (its paths, its size); target_confidence is the
        # calibrated confidence that ends stage 1 or 2, vote_target the stop rule's target
        # in stage 3, both chosen by bench/quality.py on the fit half
        Mode.auto: ModeConfig(
            samples=5, max_samples=12, temperature=0.4, max_new_tokens=1024,
            max_max_new_tokens=4096, sample_timeout_s=90, task_timeout_s=420, max_timeout_s=900,
            early_stop=True, target_confidence=AUTO_TARGET, vote_target=AUTO_VOTE_TARGET,
            paths=[ReasoningPath.cot, ReasoningPath.pot, ReasoningPath.decompose], cascade=True,
        ),
    }  # fmt: skip
