"""The filter's model: the SigLIP2 scorer of a filter config. The dedup stage embeds with it too
when it reuses the filter's embeddings."""

from __future__ import annotations

from dataminer_dagster.assets.filter.config import FilterConfig


def load_scorer(config: FilterConfig):
    """The SigLIP2 scorer of a filter config (loaded once per process and model)."""
    from dataminer_dagster.models.siglip import SiglipScorer

    return SiglipScorer(config.model, device=config.device, batch_size=config.batch_size)
