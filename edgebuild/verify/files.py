"""The local files a recipe's validation reads.

They are build inputs like the source model: their digests go into the cache keys of the
stages that read them (editing a ``.npz`` reruns validation), and they are prerequisites in
the depfile and the up-to-date check.
"""

from __future__ import annotations

from pathlib import Path

IMAGE_SUFFIXES = (".npy", ".png", ".jpg", ".jpeg")


def image_files(folder: Path) -> list[Path]:
    """The images of an ``images.dir`` folder, in the order samples use them."""
    return sorted(p for p in folder.iterdir() if p.suffix.lower() in IMAGE_SUFFIXES)


def input_paths(section, base_dir: Path) -> list[Path]:
    """Files and image folders named by ``validate.inputs`` (a folder is listed before its images), and the
    tokenizer file of ``validate.generation``."""
    paths: list[Path] = []
    for source in (section.inputs.values() if section is not None else ()):
        if source.file is not None:
            paths.append(Path(base_dir) / source.file)
        elif source.images is not None:
            folder = Path(base_dir) / source.images.dir
            paths.append(folder)
            if folder.is_dir():
                paths.extend(image_files(folder))
    generation = getattr(section, "generation", None)
    if generation is not None and not isinstance(generation.prompts, list):  # prompts as texts
        paths.append(Path(base_dir) / generation.prompts.tokenizer)
    return paths


def input_digests(section, base_dir: Path) -> dict[str, str]:
    """``{path as written relative to the recipe: sha256}`` of every input file; a missing one is
    ``"missing"`` (the stage that reads it reports the error)."""
    from edgebuild.store.hashstate import file_sha256

    digests = {}
    for path in input_paths(section, base_dir):
        if path.is_dir():
            continue
        name = Path(path).relative_to(base_dir).as_posix() if Path(path).is_relative_to(base_dir) else str(path)
        digests[name] = file_sha256(path) if path.is_file() else "missing"
    return digests


def digest_params(section, base_dir: Path) -> dict:
    """What a stage reading the validation inputs adds to its cache-key parameters: the input
    files' digests, or nothing when the recipe names none (keys stay as they were)."""
    digests = input_digests(section, base_dir)
    return {"input_files": digests} if digests else {}
