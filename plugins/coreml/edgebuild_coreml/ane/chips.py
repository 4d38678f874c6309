"""Chip profiles (peak throughput, memory bandwidth) read from chips.yaml."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from importlib import resources

import yaml

from edgebuild.plugin import UsageError


@dataclass(frozen=True)
class Figure:
    """One published or estimated number and where it comes from."""

    value: float
    source: str


@dataclass(frozen=True)
class ChipProfile:
    name: str
    display_name: str
    ane_tops: Figure
    ane_tops_precision: str
    ane_int8_compute: bool
    gpu_fp32_tflops: Figure
    gpu_fp16_tflops: Figure
    bandwidth_gbs: Figure
    cpu_gflops: Figure

    @property
    def ane_fp16_tflops(self) -> float:
        # From A17 Pro / M4 on Apple quotes int8 TOPS; fp16 runs at half that rate.
        factor = 0.5 if self.ane_tops_precision == "int8" else 1.0
        return self.ane_tops.value * factor


def _figure(entry: dict) -> Figure:
    return Figure(value=float(entry["value"]), source=str(entry["source"]))


@functools.lru_cache(maxsize=1)
def load_chips() -> dict[str, ChipProfile]:
    """Every chip profile, keyed by its short name (``m1``, ``m3_max``, ``a17_pro`` ...)."""
    text = resources.files(__package__).joinpath("chips.yaml").read_text(encoding="utf-8")
    data = yaml.load(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))  # libyaml's: 8x faster
    chips = {}
    for name, entry in data["chips"].items():
        chips[name] = ChipProfile(
            name=name,
            display_name=entry["display_name"],
            ane_tops=_figure(entry["ane_tops"]),
            ane_tops_precision=entry["ane_tops_precision"],
            ane_int8_compute=bool(entry["ane_int8_compute"]["value"]),
            gpu_fp32_tflops=_figure(entry["gpu_fp32_tflops"]),
            gpu_fp16_tflops=_figure(entry["gpu_fp16_tflops"]),
            bandwidth_gbs=_figure(entry["bandwidth_gbs"]),
            cpu_gflops=_figure(entry["cpu_gflops"]),
        )
    return chips


def normalise_chip_name(name: str) -> str:
    """Accept the spellings people type: ``M3 Max``, ``m3-max``, ``A17Pro`` -> ``m3_max``, ``a17_pro``."""
    key = name.strip().lower().replace("-", "_").replace(" ", "_")
    for suffix in ("pro", "max"):
        if key.endswith(suffix) and not key.endswith("_" + suffix):
            key = key[: -len(suffix)] + "_" + suffix
    return key


def get_chip(name: str | ChipProfile) -> ChipProfile:
    """The profile for ``name``; a UsageError listing the known chips otherwise."""
    if isinstance(name, ChipProfile):
        return name
    chips = load_chips()
    key = normalise_chip_name(name)
    if key not in chips:
        known = ", ".join(sorted(chips))
        raise UsageError(f"unknown chip {name!r} in compute.chip", hint=f"use one of: {known}")
    return chips[key]
