"""Every code block of README.md and the guides a newcomer follows works as written.

A fenced block is checked unless the line right before its opening fence is
``<!-- fragment -->`` (a synopsis, an excerpt, output). Always (quick): shell blocks parse
(``bash -n``), Python blocks compile, YAML blocks load (a recipe through the recipe loader),
JSON and TOML blocks parse, and every ``edgebuild ...`` command line names a real command and
real options of the CLI (in fragments too). Slow (``make docs-check``): each document's blocks
run in order, shell with bash and Python with python, in a fresh copy of the tree whose
``.venv`` is this test environment; a ``console`` block runs its ``$ `` lines and ignores the
output shown, and a block that installs packages is refused rather than run.

``python tests/test_docs_blocks.py [TREE]`` prints, per document, how many of its blocks run
as written (TREE's docs against TREE's code; default this tree).
"""

from __future__ import annotations

import ast
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
DOCUMENTS = ["README.md", "docs/start.md", "docs/plugins.md", "docs/ci.md", "docs/llm.md"]
FRAGMENT = "<!-- fragment -->"
SHELL = {"", "sh", "bash", "shell", "console"}
BLOCK_TIMEOUT = 1800  # s: a block that builds models on a busy 2-core machine
INSTALLS = re.compile(r"\bpip3? install\b|\bmake (install|test-env)\b")
FENCE = re.compile(r"^(?P<indent> {0,3})(?P<fence>`{3,}|~{3,})\s*(?P<lang>[\w+-]*)")


@dataclass
class Block:
    document: str
    line: int  # of the opening fence, 1-based
    lang: str
    text: str
    fragment: bool

    @property
    def where(self) -> str:
        return f"{self.document}:{self.line}"

    def commands(self) -> str:
        """The shell this block runs: a console block's ``$ `` lines (with their continuations)."""
        if self.lang != "console":
            return self.text
        kept, going_on = [], False
        for line in self.text.splitlines():
            if line.startswith("$ ") or going_on:
                kept.append(line[2:] if line.startswith("$ ") and not going_on else line)
                going_on = line.endswith("\\")
        return "\n".join(kept) + "\n"


def blocks(path: Path, name: str) -> list[Block]:
    found, lines, i = [], path.read_text().splitlines(), 0
    while i < len(lines):
        opening = FENCE.match(lines[i])
        if not opening:
            i += 1
            continue
        fence, start = opening["fence"], i
        i += 1
        body = []
        while i < len(lines) and not lines[i].strip().startswith(fence):
            body.append(lines[i][len(opening["indent"]):])
            i += 1
        fragment = start > 0 and lines[start - 1].strip() == FRAGMENT
        found.append(Block(name, start + 1, opening["lang"].lower(), "\n".join(body) + "\n", fragment))
        i += 1
    return found


def checked_blocks(tree: Path = ROOT) -> list[Block]:
    return [b for name in DOCUMENTS if (tree / name).is_file() for b in blocks(tree / name, name) if not b.fragment]


# --- the quick part: parse, and the CLI's commands and options -------------------------------

def parse_error(block: Block, tree: Path = ROOT) -> str | None:
    """Why ``block`` does not parse, or None."""
    if block.lang in SHELL:
        done = subprocess.run(["bash", "-n"], input=block.commands(), capture_output=True, text=True)
        return done.stderr.strip() or None if done.returncode else None
    if block.lang in ("python", "py"):
        try:
            compile(block.text, block.where, "exec", flags=ast.PyCF_ONLY_AST)
        except SyntaxError as exc:
            return f"line {exc.lineno}: {exc.msg}"
        return None
    if block.lang in ("yaml", "yml"):
        try:
            data = yaml.safe_load(block.text)
        except yaml.YAMLError as exc:
            return str(exc)
        if isinstance(data, dict) and "edgebuild" in data:
            return recipe_error(block, tree)
        return None
    if block.lang == "json":
        try:
            json.loads(block.text)
        except ValueError as exc:
            return str(exc)
        return None
    if block.lang == "toml":
        import tomllib

        try:
            tomllib.loads(block.text)
        except tomllib.TOMLDecodeError as exc:
            return str(exc)
    return None


def recipe_error(block: Block, tree: Path) -> str | None:
    """A recipe block loads through the recipe loader, as a file in its document's folder."""
    from edgebuild.errors import RecipeError
    from edgebuild.recipe import load_recipe

    folder = (tree / block.document).parent
    with tempfile.TemporaryDirectory(dir=folder, prefix=".docs-block-") as tmp:
        path = Path(tmp) / "recipe.yaml"
        path.write_text(block.text)
        try:
            load_recipe(path)
        except RecipeError as exc:
            return str(exc)
    return None


def command_lines(block: Block) -> list[list[str]]:
    """Each ``edgebuild ...`` command of a shell block, as words (after env assignments and
    ``.venv/bin/``), comments, pipes and ``&&`` taken off."""
    text = block.commands().replace("\\\n", " ")
    found = []
    for line in text.splitlines():
        lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
        lexer.whitespace_split, lexer.commenters = True, "#"
        try:
            words = list(lexer)
        except ValueError:
            continue  # bash -n reports what does not parse
        command: list[str] = []
        for word in [*words, ";"]:
            if word in (";", "&&", "||", "|", "&", "(", ")"):
                while command and re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", command[0]):
                    command.pop(0)
                if command and Path(command[0]).name == "edgebuild":
                    found.append(command[1:])
                command = []
            else:
                command.append(word)
    return found


def cli_error(args: list[str]) -> str | None:
    """Why ``edgebuild ARGS`` names no real command or option, or None (plugin commands count)."""
    import typer

    from edgebuild.cli.app import app

    command = typer.main.get_command(app)  # typer's click: read by its interface, not its classes
    context = command.context_class(command, info_name="edgebuild")
    path = ["edgebuild"]
    for position, word in enumerate(args):
        if word.startswith("-"):
            name = word.split("=", 1)[0]
            known = {o for p in command.params for o in (*p.opts, *p.secondary_opts)} | {"--help"}
            if name not in known:
                return f"{' '.join(path)}: no option {name} (it has {', '.join(sorted(known))})"
            continue
        if hasattr(command, "list_commands"):
            sub = command.get_command(context, word)
            if sub is None:
                if any(a.startswith("-") for a in args[:position]) and path == ["edgebuild"]:
                    return None  # `edgebuild --version` and its like end here
                from edgebuild.first_party import provided_by

                if path == ["edgebuild"] and provided_by("commands", word):
                    return None  # a first-party plugin's command, that plugin not installed here
                return f"{' '.join(path)}: no command {word!r} (it has {', '.join(command.list_commands(context))})"
            command, path = sub, [*path, word]
            context = command.context_class(command, info_name=word, parent=context)
    return None


QUICK = [b for b in checked_blocks()]


@pytest.mark.parametrize("block", QUICK, ids=lambda b: b.where)
def test_every_block_parses(block):
    error = parse_error(block)
    assert error is None, f"{block.where} ({block.lang or 'plain'}): {error}"


EVERY = [b for name in DOCUMENTS if (ROOT / name).is_file() for b in blocks(ROOT / name, name)]


# fragments too: a synopsis or a CI step is not run here, but its commands and options must exist
@pytest.mark.parametrize("block", [b for b in EVERY if b.lang in SHELL and command_lines(b)], ids=lambda b: b.where)
def test_every_edgebuild_command_line_names_real_commands_and_options(block):
    errors = [f"edgebuild {' '.join(words)}: {error}" for words in command_lines(block)
              if (error := cli_error(words)) is not None]
    assert not errors, f"{block.where}: " + "; ".join(errors)


def test_the_checker_tells_good_from_bad():
    """The checks themselves can fail: a bad command, a bad option, a block that does not parse."""
    assert cli_error(["run", "recipes/orientation.yaml", "--json"]) is None
    assert cli_error(["--version"]) is None
    assert "no command 'frobnicate'" in cli_error(["frobnicate"])
    assert "no option --jsn" in cli_error(["run", "x.yaml", "--jsn"])
    shell = Block("x.md", 1, "sh", "edgebuild run r.yaml && edgebuild cache info | head\nif then fi\n", False)
    assert command_lines(shell) == [["run", "r.yaml"], ["cache", "info"]] and parse_error(shell)
    console = Block("x.md", 1, "console", "$ edgebuild plan r.yaml\nCompute plan ...\n", False)
    assert console.commands() == "edgebuild plan r.yaml\n" and parse_error(console) is None
    text = "a\n\n<!-- fragment -->\n```sh\nedgebuild nothing\n```\n\n```python\nx = (\n```\n"
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "d.md").write_text(text)
        first, second = blocks(Path(tmp) / "d.md", "d.md")
    assert first.fragment and not second.fragment and parse_error(second)
    installs = Block("x.md", 1, "sh", "pip install ./plugins/coreml\n", False)
    assert "installs packages" in run_block(installs, Path(tmp), {})  # refused, not run


# --- the slow part: run each document's blocks in a fresh copy of the tree --------------------

def fresh_tree(dest: Path, tree: Path = ROOT) -> Path:
    """The files git tracks or would track, as a fresh clone has them, and a ``.venv`` that is
    this environment (so ``make demo`` finds it made, and ``. .venv/bin/activate`` works)."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=tree,
                            capture_output=True, text=True, check=True).stdout.split("\0")
    for name in filter(None, listed):
        if (tree / name).is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(tree / name, dest / name)
    venv, here = dest / ".venv", Path(sys.prefix)
    (venv / "bin").mkdir(parents=True)
    for tool in (here / "bin").iterdir():
        (venv / "bin" / tool.name).symlink_to(tool)
    for name in ("lib", "lib64", "include"):  # its packages, found through pyvenv.cfg as in any venv
        if (here / name).exists():
            (venv / name).symlink_to(here / name, target_is_directory=True)
    shutil.copy(here / "pyvenv.cfg", venv / "pyvenv.cfg")
    for stamp in (".demo-installed", ".installed"):
        (dest / ".venv" / stamp).touch()  # after the copies: newer than every pyproject.toml
    return dest


def run_environment(tree: Path, store: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONHOME")}
    env.update(PATH=f"{tree / '.venv' / 'bin'}{os.pathsep}{env.get('PATH', '')}", PYTHONPATH=str(tree),
               EDGEBUILD_CACHE_DIR=str(store), NO_COLOR="1")
    return env


def shared_store(dest: Path) -> Path:
    """A store of its own whose downloaded sources are the user's, so each wheel is fetched once."""
    from edgebuild.store.location import cache_root

    dest.mkdir()
    shared = cache_root(None) / "sources"
    shared.mkdir(parents=True, exist_ok=True)
    (dest / "sources").symlink_to(shared, target_is_directory=True)
    return dest


def run_block(block: Block, tree: Path, env: dict) -> str | None:
    """Run ``block`` in ``tree``; why it failed, or None."""
    if block.lang in SHELL and INSTALLS.search(block.commands()):
        return "installs packages: its .venv is the test environment, which a docs check must not change"
    if block.lang in SHELL:
        command = ["bash", "-e", "-o", "pipefail", "-c", block.commands()]
    elif block.lang in ("python", "py"):
        command = [str(tree / ".venv" / "bin" / "python"), "-c", block.text]
    else:
        return parse_error(block, tree)
    try:
        done = subprocess.run(command, cwd=tree, env=env, capture_output=True, text=True, timeout=BLOCK_TIMEOUT)
    except subprocess.TimeoutExpired:
        return f"still running after {BLOCK_TIMEOUT} s"
    if done.returncode:
        return f"exit {done.returncode}: {(done.stderr or done.stdout).strip()[-1500:]}"
    return None


def run_document(name: str, work: Path, tree: Path = ROOT) -> list[tuple[Block, str | None]]:
    copy = fresh_tree(work / "tree", tree)
    env = run_environment(copy, shared_store(work / "store"))
    return [(block, run_block(block, copy, env)) for block in blocks(copy / name, name) if not block.fragment]


@pytest.mark.slow  # the blocks build models: the demo, the tour, the LLM example
@pytest.mark.parametrize("document", DOCUMENTS)
def test_every_block_of_the_document_runs_as_written(document, tmp_path):
    if not (ROOT / document).is_file():
        pytest.fail(f"{document} is gone; update DOCUMENTS")
    failures = [f"{block.where} ({block.lang or 'plain'}): {error}" for block, error in run_document(document, tmp_path)
                if error is not None]
    assert not failures, "\n\n".join(failures)


def main(tree: Path) -> None:
    total = passed = 0
    for name in DOCUMENTS:
        if not (tree / name).is_file():
            continue
        every = blocks(tree / name, name)
        with tempfile.TemporaryDirectory(prefix="edgebuild-docs-") as tmp:
            results = run_document(name, Path(tmp), tree)
        ok = sum(error is None for _, error in results)
        total, passed = total + len(every), passed + ok
        print(f"{name}: {ok} of {len(every)} blocks run as written ({len(every) - len(results)} marked fragments)")
        for block, error in results:
            if error is not None:
                print(f"  {block.where}: {error.splitlines()[0][:200] if error else ''}")
    print(f"all: {passed} of {total}")


if __name__ == "__main__":
    main(Path(sys.argv[1]).resolve() if len(sys.argv) > 1 else ROOT)
