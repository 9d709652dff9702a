"""The offline text corpus for real-LM activations (docs/ecosystem.md §5, "Text for activations").

The project ships ``empirics/data/corpus.jsonl.gz``: English documentation prose taken from the
Python 3.11.7 standard library, which is installed on every machine that runs dictcheck and is
under the PSF License 2.0 (permissive; redistribution with attribution). Nothing is fetched at
run time. Each line is one document ``{"origin": ..., "text": ...}``:

* the docstrings (``ast.get_docstring``) of every module, class and function in the standard
  library's ``.py`` files, at least :data:`MIN_DOC_CHARS` characters long, in sorted path order,
  read with :mod:`ast` (no module is imported); test suites, IDLE, lib2to3, ensurepip, turtledemo
  and site-packages are skipped;
* then the topics of the language reference shipped as ``pydoc_data.topics.topics`` (sorted by key);
* a text already seen is kept once (its first occurrence).

:func:`build_corpus_documents` is the exact generator; a test rebuilds the file on Python 3.11.7 and
compares. :func:`load_corpus` verifies the SHA-256 of the decompressed bytes against
:data:`CORPUS_SHA256`, so a modified file is an error, never silently different activations.
"""

from __future__ import annotations

import ast
import gzip
import hashlib
import json
import os
import sysconfig
from dataclasses import dataclass
from pathlib import Path

#: The shipped corpus file.
CORPUS_PATH = Path(__file__).resolve().parent / "corpus.jsonl.gz"
#: SHA-256 of the decompressed JSONL bytes of :data:`CORPUS_PATH`.
CORPUS_SHA256 = "ff391d9d9f9e6cdadf1d1f57c269a7f94886b95214ac4c4d42dcc7a628d0711c"
#: Python version whose standard library the shipped corpus was built from.
CORPUS_PYTHON = "3.11.7"
#: Human-readable provenance recorded in activation manifests.
CORPUS_SOURCE = (f"dictcheck corpus v1: Python {CORPUS_PYTHON} standard-library docstrings and "
                 "pydoc_data language-reference topics (PSF License 2.0)")
#: Shortest docstring kept (characters); shorter ones are mostly one-line summaries.
MIN_DOC_CHARS = 200
#: Standard-library directories left out (tests, tools, vendored packages).
SKIPPED_DIRS = frozenset({"test", "tests", "idle_test", "idlelib", "lib2to3", "ensurepip", "turtledemo",
                          "site-packages", "__pycache__"})


@dataclass(frozen=True)
class Corpus:
    """Documents of the corpus, its provenance line and the SHA-256 of its bytes."""

    texts: list[str]
    source: str
    sha256: str


def _docstrings(stdlib: Path) -> list[tuple[str, str]]:
    """(origin, docstring) for every long-enough module/class/function docstring under ``stdlib``."""
    found: list[tuple[str, str]] = []
    for root, dirs, files in os.walk(stdlib):
        dirs[:] = sorted(d for d in dirs if d not in SKIPPED_DIRS and not d.startswith("config-"))
        for name in sorted(files):
            if not name.endswith(".py"):
                continue
            path = Path(root) / name
            try:
                tree = ast.parse(path.read_text(encoding="utf-8"))
            except (SyntaxError, UnicodeDecodeError):  # deliberately broken files of the stdlib
                continue
            rel = path.relative_to(stdlib).as_posix()
            for node in ast.walk(tree):
                if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                    doc = ast.get_docstring(node)
                    if doc is not None and len(doc) >= MIN_DOC_CHARS:
                        found.append((f"{rel}:{getattr(node, 'name', '<module>')}", doc))
    return found


def build_corpus_documents() -> list[dict[str, str]]:
    """The corpus documents, built from this interpreter's standard library (see module docstring)."""
    from pydoc_data.topics import topics

    candidates = _docstrings(Path(sysconfig.get_paths()["stdlib"]))
    candidates += [(f"pydoc_data.topics:{key}", topics[key]) for key in sorted(topics)]
    seen: set[str] = set()
    documents: list[dict[str, str]] = []
    for origin, text in candidates:
        if text not in seen:
            seen.add(text)
            documents.append({"origin": origin, "text": text})
    return documents


def corpus_bytes(documents: list[dict[str, str]]) -> bytes:
    """The JSONL serialisation (one ``{"origin", "text"}`` object per line) that is hashed and gzipped."""
    return "".join(json.dumps(doc, ensure_ascii=False, sort_keys=True) + "\n" for doc in documents).encode("utf-8")


def write_corpus(path: Path = CORPUS_PATH) -> str:
    """Rebuild the corpus file from this interpreter's stdlib (deterministic gzip); returns its SHA-256."""
    raw = corpus_bytes(build_corpus_documents())
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as fh, gzip.GzipFile(filename="", mode="wb", fileobj=fh, mtime=0) as gz:
        gz.write(raw)
    return hashlib.sha256(raw).hexdigest()


def load_corpus(path: Path = CORPUS_PATH, *, sha256: str | None = CORPUS_SHA256) -> Corpus:
    """The corpus at ``path`` (default: the shipped one). ValueError (one line) if the file is
    unreadable or the SHA-256 of its decompressed bytes differs from ``sha256`` (None: not checked)."""
    try:
        raw = gzip.decompress(Path(path).read_bytes())
    except (OSError, EOFError, gzip.BadGzipFile) as exc:
        raise ValueError(f"cannot read the text corpus {path}: {exc}") from None
    digest = hashlib.sha256(raw).hexdigest()
    if sha256 is not None and digest != sha256:
        raise ValueError(f"the text corpus {path} was modified: sha256 {digest[:12]}…, expected {sha256[:12]}…")
    texts = [json.loads(line)["text"] for line in raw.decode("utf-8").splitlines()]
    return Corpus(texts=texts, source=CORPUS_SOURCE if Path(path) == CORPUS_PATH else str(path), sha256=digest)
