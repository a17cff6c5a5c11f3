"""``/metrics``: counters and gauges in the Prometheus text exposition format (0.0.4).

Hand-written (a few dozen lines) instead of ``prometheus_client``: the service needs
counters with labels, gauges read when scraped, and the text format, nothing more.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Final

__all__ = ["CONTENT_TYPE", "Metrics"]

CONTENT_TYPE: Final = "text/plain; version=0.0.4; charset=utf-8"

Labels = tuple[tuple[str, str], ...]


def _esc(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _labels(labels: Labels) -> str:
    if not labels:
        return ""
    return "{" + ",".join(f'{k}="{_esc(v)}"' for k, v in labels) + "}"


#: request latency buckets, seconds (Prometheus' defaults, plus 1 ms and 2.5 ms)
BUCKETS: Final = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
                  10.0)


class Metrics:
    """Counters (``inc``), gauges (``gauge``: a callable read at scrape time) and
    histograms (``observe``)."""

    def __init__(self) -> None:
        self._help: dict[str, tuple[str, str]] = {}
        self._counters: dict[str, dict[Labels, float]] = {}
        self._gauges: dict[str, Callable[[], Iterable[tuple[Mapping[str, str], float]]]] = {}
        #: name -> labels -> (bucket counts, sum, count)
        self._hists: dict[str, dict[Labels, tuple[list[int], float, int]]] = {}
        self._buckets: dict[str, tuple[float, ...]] = {}

    def histogram(self, name: str, help_: str, buckets: tuple[float, ...] = BUCKETS) -> None:
        self._help[name] = ("histogram", help_)
        self._hists.setdefault(name, {})
        self._buckets[name] = buckets

    def observe(self, name: str, value: float, **labels: str) -> None:
        key = tuple(sorted(labels.items()))
        series = self._hists[name]
        counts, total, n = series.get(key) or ([0] * len(self._buckets[name]), 0.0, 0)
        for i, le in enumerate(self._buckets[name]):
            if value <= le:
                counts[i] += 1
        series[key] = (counts, total + value, n + 1)

    def counter(self, name: str, help_: str) -> None:
        self._help[name] = ("counter", help_)
        self._counters.setdefault(name, {})

    def inc(self, name: str, value: float = 1.0, **labels: str) -> None:
        key = tuple(sorted(labels.items()))
        series = self._counters[name]
        series[key] = series.get(key, 0.0) + value

    def gauge(self, name: str, help_: str,
              read: Callable[[], Iterable[tuple[Mapping[str, str], float]]]) -> None:
        self._help[name] = ("gauge", help_)
        self._gauges[name] = read

    def value(self, name: str, **labels: str) -> float:
        """A counter's value now (0 if never counted); for tests."""
        return self._counters.get(name, {}).get(tuple(sorted(labels.items())), 0.0)

    def render(self) -> str:
        out: list[str] = []
        for name, (kind, help_) in sorted(self._help.items()):
            out.append(f"# HELP {name} {help_}")
            out.append(f"# TYPE {name} {kind}")
            if kind == "counter":
                for key, v in sorted(self._counters[name].items()):
                    out.append(f"{name}{_labels(key)} {v:g}")
            elif kind == "histogram":
                for key, (counts, total, n) in sorted(self._hists[name].items()):
                    for le, c in zip(self._buckets[name], counts, strict=True):
                        out.append(f"{name}_bucket{_labels((*key, ('le', f'{le:g}')))} {c}")
                    out.append(f"{name}_bucket{_labels((*key, ('le', '+Inf')))} {n}")
                    out.append(f"{name}_sum{_labels(key)} {total:g}")
                    out.append(f"{name}_count{_labels(key)} {n}")
            else:
                for labels, v in self._gauges[name]():
                    out.append(f"{name}{_labels(tuple(sorted(labels.items())))} {v:g}")
        return "\n".join(out) + "\n"
