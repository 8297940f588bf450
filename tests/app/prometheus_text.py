"""Read a Prometheus exposition the way a scraper does, instead of matching its text."""

from prometheus_client.parser import text_string_to_metric_families

LABEL_ORDER = ("plugin", "hook", "le", "quantile")


def prometheus_samples(text: str) -> dict[tuple[str, tuple[str, ...]], float]:
    """Every sample, keyed by its name and its plugin, hook (and le or quantile) label values."""
    return {(s.name, tuple(s.labels[k] for k in LABEL_ORDER if k in s.labels)): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}
