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


class Metrics:
    """Counters (``inc``) and gauges (``gauge``: a callable read at scrape time)."""

    def __init__(self) -> None:
        self._help: dict[str, tuple[str, str]] = {}
        self._counters: dict[str, dict[Labels, float]] = {}
        self._gauges: dict[str, Callable[[], Iterable[tuple[Mapping[str, str], float]]]] = {}

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
            else:
                for labels, v in self._gauges[name]():
                    out.append(f"{name}{_labels(tuple(sorted(labels.items())))} {v:g}")
        return "\n".join(out) + "\n"
