"""The children's metrics, served by the parent: the families a child updates (queue, batches,
steps, sentences) are fetched from every `EngineProcess` at each scrape and summed sample by
sample, in place of the parent's own copies, which are unregistered.
"""

from __future__ import annotations

import weakref
from typing import TYPE_CHECKING

from prometheus_client.metrics_core import Metric

from service.metrics import MODEL_SCOPED, Metrics

if TYPE_CHECKING:
    from service.parallel.engine_process import EngineProcess

# Metrics the child updates; the parent's copies are unregistered and the child's served instead.
CHILD_METRICS = tuple(m for m in MODEL_SCOPED if m != "time_to_first_chunk")


class _ChildMetrics:
    """A Prometheus collector: the children's families, fetched at scrape time and summed sample by
    sample (each child counts its own sentences, steps and queue)."""

    def __init__(self, children: list[EngineProcess], names: set[str]):
        self.children, self.names = children, names

    def describe(self) -> list[Metric]:
        return []  # names are not known before the children answer; they never clash (unregistered)

    def collect(self) -> list[Metric]:
        merged: dict[str, Metric] = {}
        for child in self.children:
            for fam in child.fetch_metrics():
                if fam.name not in self.names:
                    continue
                if fam.name not in merged:
                    merged[fam.name] = fam
                    continue
                into = merged[fam.name]
                index = {(s.name, tuple(sorted(s.labels.items()))): i for i, s in enumerate(into.samples)}
                for smp in fam.samples:
                    i = index.get((smp.name, tuple(sorted(smp.labels.items()))))
                    if i is None:
                        into.samples.append(smp)
                    elif not smp.name.endswith("_created"):
                        into.samples[i] = into.samples[i]._replace(value=into.samples[i].value + smp.value)
        return list(merged.values())


_collectors: weakref.WeakKeyDictionary[Metrics, _ChildMetrics] = weakref.WeakKeyDictionary()


def serve_child_metrics(metrics: Metrics, children: list[EngineProcess]) -> None:
    """Serve the children's copies of the metrics they update. The first pool of a server
    unregisters the parent's copies; every pool's children (one pool per model version) join
    the one collector, whose samples the `model` and `version` labels keep apart."""
    collector = _collectors.get(metrics)
    if collector is None:
        names: set[str] = set()
        for attr in CHILD_METRICS:
            m = getattr(metrics, attr)
            names |= {f.name for f in m.collect()}
            metrics.registry.unregister(m)
        collector = _collectors[metrics] = _ChildMetrics([], names)
        metrics.registry.register(collector)
    collector.children.extend(children)


def forget_child_metrics(metrics: Metrics, children: list[EngineProcess]) -> None:
    """An unloaded pool's children leave the collector."""
    collector = _collectors.get(metrics)
    if collector is not None:
        collector.children[:] = [c for c in collector.children if c not in children]
