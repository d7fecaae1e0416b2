"""Where a new pane's sampling settings come from, and the words the pane shows for it.

Three layers, the nearer one winning field by field: what the user changed in
Preferences (a field that differs from Tandem's defaults), then what the
model recommends in its generation_config.json (Engine.recommended_sampling),
then Tandem's defaults (engine.params.SamplingParams' own, the ecosystem's).
"""

from __future__ import annotations

from collections.abc import Mapping

from engine.params import MODEL_RECOMMENDED, TANDEM_DEFAULTS, SamplingParams, defaults_for

# A pane whose settings came from Preferences rather than the model or Tandem.
PREFERENCES_DEFAULTS = "your defaults from Preferences"
# Every source a pane's automatic settings may have; "" means the user set them in the pane.
AUTOMATIC_SOURCES = (MODEL_RECOMMENDED, TANDEM_DEFAULTS, PREFERENCES_DEFAULTS)


def new_pane_params(
    preferences: SamplingParams, recommended: Mapping[str, int | float]
) -> tuple[SamplingParams, str]:
    """The settings a new pane on a model recommending `recommended` starts
    with, and which of AUTOMATIC_SOURCES names them."""
    tandem = SamplingParams()
    # A field the user changed in Preferences is their choice, whatever the model says.
    left = {k: v for k, v in recommended.items() if getattr(preferences, k) == getattr(tandem, k)}
    params, source = defaults_for(left, preferences)
    if source == TANDEM_DEFAULTS and preferences != tandem:
        source = PREFERENCES_DEFAULTS
    return params, source


def source_line(source: str) -> str:
    """The pane's line about it, e.g. "Sampling: the model's recommended settings"; "" for settings the user set."""
    return f"Sampling: {source}" if source else ""
