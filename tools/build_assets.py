"""Build the offline training assets shipped with ``qwen3_trn``.

Run ``python tools/build_assets.py`` from a checkout to (re)build, into
``qwen3_trn/data/assets/`` by default (a development tool: the package ships the files):

* ``corpus.jsonl.gz`` / ``corpus_val.jsonl.gz`` -- English text, one
  ``{"text": ...}`` document per line (~98% / ~2% of the documents).
* ``tokenizer/tokenizer.json`` + ``tokenizer/tokenizer_config.json`` -- a
  byte-level BPE tokenizer with exactly 2048 entries (torchtitan's Qwen3
  ``debugmodel`` vocab size) that loads with torchtitan's
  ``HuggingFaceTokenizer`` and with ``transformers.AutoTokenizer``.

The text is the documentation that ships with every CPython install:

* docstrings of pure-Python stdlib modules, read with :mod:`ast` from the
  source files -- nothing is imported or executed, so modules with import side
  effects cannot misbehave;
* docstrings of the C-implemented stdlib modules (``builtins``, ``math``,
  ``_io``, ``_decimal``, ...) read with :func:`inspect.getdoc` after importing
  them; extension modules are free of import side effects apart from the few
  on a deny-list;
* the language-reference topics behind ``help()`` (``pydoc_data.topics``).

Test packages, GUI code (``tkinter``, ``idlelib``, ``turtledemo``), codec
tables (``encodings``) and joke modules (``this``, ``antigravity``) are left
out. Every step runs in a fixed order and the outputs carry no timestamps, so
the same Python version produces byte-identical files.
"""

from __future__ import annotations

import argparse
import ast
import gzip
import hashlib
import importlib
import inspect
import io
import json
import os
import pkgutil
import re
import sys
import sysconfig
import time
import unicodedata
import warnings
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from types import ModuleType

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's package, run as a script

from qwen3_trn.data.embedded import CORPUS_FILE, PACKAGED_ASSETS_DIR, TOKENIZER_SUBDIR, VAL_CORPUS_FILE  # noqa: E402

DEFAULT_ASSETS_DIR = PACKAGED_ASSETS_DIR

VOCAB_SIZE = 2048
MIN_DOC_CHARS = 200
MAX_DOC_CHARS = 4000
VAL_EVERY = 50  # a document is held out when sha256(text) % VAL_EVERY == 0 (~2%)
MAX_TOTAL_CHARS = 4_000_000

EOS_TOKEN = "<|endoftext|>"
BOS_TOKEN = "<|begin_of_text|>"
SPECIAL_TOKENS: tuple[str, ...] = (EOS_TOKEN, BOS_TOKEN, "<|im_start|>", "<|im_end|>")

# Qwen2/Qwen3 pre-tokenization regex (single digits, contractions, words, ...).
PRETOKENIZE_REGEX = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

# Top-level stdlib packages/modules never read.
_SKIP_TOP = frozenset(
    {
        "this",
        "antigravity",
        "__hello__",
        "__phello__",
        "tkinter",
        "idlelib",
        "turtledemo",
        "turtle",
        "test",
        "encodings",
        "ensurepip",
        "lib2to3",
        "pydoc_data",  # its text is added separately as help() topics
        "site-packages",
    }
)
# Sub-package names (any depth) never read.
_SKIP_ANY = frozenset({"test", "tests", "idle_test", "__pycache__"})
# C modules not imported (side effects on import, test helpers, deprecated stubs).
_SKIP_C_PREFIXES = ("_test", "xx", "_xx", "_ctypes_test", "_tkinter", "readline", "_curses", "__")

_CTRL_RE = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")
_BLANKS_RE = re.compile(r"\n{3,}")


@dataclass(frozen=True)
class AssetStats:
    train_docs: int
    val_docs: int
    train_chars: int
    val_chars: int
    corpus_gz_bytes: int
    val_gz_bytes: int
    vocab_size: int
    tokenizer_train_s: float
    chars_per_token: float


# --------------------------------------------------------------------------- text


def clean_text(text: str) -> str:
    """Normalize a docstring: NFC, no tabs/control chars/trailing spaces, no doctest blocks."""
    text = unicodedata.normalize("NFC", text).replace("\r\n", "\n").replace("\r", "\n")
    text = _CTRL_RE.sub("", text.expandtabs(4))
    lines: list[str] = []
    in_doctest = False
    for line in text.split("\n"):
        stripped = line.strip()
        if stripped.startswith(">>>"):
            in_doctest = True
        elif not stripped:
            in_doctest = False
        if not in_doctest:
            lines.append(line.rstrip())
    text = _BLANKS_RE.sub("\n\n", "\n".join(lines)).strip()
    return text


def _is_prose(text: str) -> bool:
    return len(text) >= 20 and sum(w.isalpha() for w in text.split()) >= 3


def _split_long(text: str, max_chars: int) -> list[str]:
    """Split ``text`` into pieces of at most ``max_chars``: paragraphs, then lines, then hard."""
    if len(text) <= max_chars:
        return [text]
    for sep in ("\n\n", "\n", " "):
        parts = text.split(sep)
        if len(parts) > 1:
            break
    else:
        return [text[i : i + max_chars] for i in range(0, len(text), max_chars)]
    out: list[str] = []
    cur = ""
    for part in parts:
        for piece in _split_long(part, max_chars):
            if cur and len(cur) + len(sep) + len(piece) > max_chars:
                out.append(cur)
                cur = piece
            else:
                cur = f"{cur}{sep}{piece}" if cur else piece
    if cur:
        out.append(cur)
    return [p.strip() for p in out if p.strip()]


# ------------------------------------------------------------------ stdlib walking


def stdlib_dir() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def _pure_python_modules(root: Path, only: Sequence[str] | None) -> list[tuple[str, Path]]:
    """(dotted name, source file) of every pure-Python stdlib module, sorted by name."""
    stdlib_names = getattr(sys, "stdlib_module_names", None)
    found: list[tuple[str, Path]] = []

    def walk(path: Path, prefix: str) -> None:
        for info in sorted(pkgutil.iter_modules([str(path)]), key=lambda m: m.name):
            name = prefix + info.name
            if info.name in _SKIP_ANY:
                continue
            if info.ispkg:
                init = path / info.name / "__init__.py"
                if init.is_file():
                    found.append((name, init))
                walk(path / info.name, name + ".")
            else:
                src = path / f"{info.name}.py"
                if src.is_file():
                    found.append((name, src))

    for info in sorted(pkgutil.iter_modules([str(root)]), key=lambda m: m.name):
        top = info.name
        if top in _SKIP_TOP or (only is not None and top not in only):
            continue
        if stdlib_names is not None and top not in stdlib_names:
            continue
        if info.ispkg:
            init = root / top / "__init__.py"
            if init.is_file():
                found.append((top, init))
            walk(root / top, top + ".")
        elif (root / f"{top}.py").is_file():
            found.append((top, root / f"{top}.py"))
    return sorted(found)


def _signature(args: ast.arguments) -> str:
    names = [a.arg for a in (*args.posonlyargs, *args.args)]
    if args.vararg is not None:
        names.append("*" + args.vararg.arg)
    elif args.kwonlyargs:
        names.append("*")
    names.extend(a.arg for a in args.kwonlyargs)
    if args.kwarg is not None:
        names.append("**" + args.kwarg.arg)
    return "(" + ", ".join(names) + ")"


def _ast_sections(source: str) -> Iterator[tuple[str, str]]:
    """(heading, docstring) for the module and each class/function, in source order."""
    tree = ast.parse(source)
    doc = ast.get_docstring(tree)
    if doc:
        yield "", doc

    def visit(body: list[ast.stmt], prefix: str) -> Iterator[tuple[str, str]]:
        for node in body:
            if isinstance(node, ast.ClassDef):
                qual = prefix + node.name
                d = ast.get_docstring(node)
                if d:
                    yield f"class {qual}", d
                yield from visit(node.body, qual + ".")
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                qual = prefix + node.name
                d = ast.get_docstring(node)
                if d:
                    yield qual + _signature(node.args), d
            elif isinstance(node, (ast.If, ast.Try)):  # platform-conditional definitions
                yield from visit(node.body, prefix)
                yield from visit(node.orelse, prefix)

    yield from visit(tree.body, "")


def _c_module_names(root: Path) -> list[str]:
    names = set(sys.builtin_module_names)
    dynload = root / "lib-dynload"
    if dynload.is_dir():
        names.update(m.name for m in pkgutil.iter_modules([str(dynload)]))
    return sorted(n for n in names if not n.startswith(_SKIP_C_PREFIXES) and n not in _SKIP_TOP)


def _own_doc(obj: object) -> str | None:
    doc = getattr(obj, "__doc__", None)
    return inspect.cleandoc(doc) if isinstance(doc, str) and doc.strip() else None


def _runtime_sections(mod: ModuleType) -> Iterator[tuple[str, str]]:
    """(heading, docstring) of a C module and its classes/functions, sorted by name."""
    doc = inspect.getdoc(mod)
    if doc:
        yield "", doc
    for name, obj in sorted(vars(mod).items()):
        if getattr(obj, "__module__", mod.__name__) != mod.__name__:
            continue
        if inspect.isclass(obj):
            d = _own_doc(obj)
            if d:
                yield f"class {name}", d
            for mname, member in sorted(vars(obj).items()):
                md = _own_doc(member) if callable(member) or inspect.isdatadescriptor(member) else None
                if md:
                    yield f"{name}.{mname}", md
        elif inspect.isroutine(obj):
            d = _own_doc(obj)
            if d:
                yield name, d


def _import_quietly(name: str) -> ModuleType | None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            return importlib.import_module(name)
        except BaseException:  # noqa: BLE001 - any failure just skips the module
            return None


def _pydoc_topics() -> list[tuple[str, str]]:
    try:
        from pydoc_data.topics import topics
    except ImportError:
        return []
    return [(k, v) for k, v in sorted(topics.items()) if isinstance(v, str)]


# ------------------------------------------------------------------- corpus build


def iter_module_texts(
    modules: Sequence[str] | None = None,
    include_c_modules: bool = True,
    include_topics: bool = True,
) -> Iterator[tuple[str, list[str]]]:
    """Yield (source name, sections) in a fixed order; each section is one cleaned text."""
    root = stdlib_dir()
    seen: set[str] = set()

    def fresh(heading: str, raw: str, title: str) -> str | None:
        body = clean_text(raw)
        if not _is_prose(body):
            return None
        key = " ".join(body.split())
        if key in seen:
            return None
        seen.add(key)
        head = title if not heading else heading
        return f"{head}\n\n{body}"

    for name, path in _pure_python_modules(root, modules):
        try:
            source = path.read_text(encoding="utf-8")
            pairs = list(_ast_sections(source))
        except (SyntaxError, UnicodeDecodeError, ValueError):
            continue
        texts = [t for h, d in pairs if (t := fresh(h, d, f"Module {name}")) is not None]
        if texts:
            yield name, texts

    if include_c_modules:
        for name in _c_module_names(root):
            if modules is not None and name not in modules:
                continue
            mod = _import_quietly(name)
            if mod is None:
                continue
            texts = [t for h, d in _runtime_sections(mod) if (t := fresh(h, d, f"Module {name}")) is not None]
            if texts:
                yield name, texts

    if include_topics and modules is None:
        for topic, text in _pydoc_topics():
            t = fresh("", text, f"Topic {topic}")
            if t is not None:
                yield f"topic:{topic}", [t]


def pack_documents(
    sources: Iterable[tuple[str, list[str]]],
    min_chars: int = MIN_DOC_CHARS,
    max_chars: int = MAX_DOC_CHARS,
) -> list[str]:
    """Greedily pack sections into documents of ``min_chars``..``max_chars`` characters.

    Sections from one source stay together where they fit; a document only spans two
    sources when the first source is too short on its own.
    """
    docs: list[str] = []
    cur = ""
    for _, sections in sources:
        for section in sections:
            for piece in _split_long(section, max_chars):
                if cur and len(cur) + 2 + len(piece) > max_chars:
                    docs.append(cur)
                    cur = piece
                else:
                    cur = f"{cur}\n\n{piece}" if cur else piece
        if len(cur) >= min_chars:
            docs.append(cur)
            cur = ""
    if len(cur) >= min_chars:
        docs.append(cur)
    elif cur and docs and len(docs[-1]) + 2 + len(cur) <= max_chars:
        docs[-1] = f"{docs[-1]}\n\n{cur}"
    out: list[str] = []
    seen: set[str] = set()
    for doc in docs:
        if min_chars <= len(doc) <= max_chars and doc not in seen:
            seen.add(doc)
            out.append(doc)
    return out


def is_validation(text: str) -> bool:
    digest = hashlib.sha256(text.encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") % VAL_EVERY == 0


def build_corpus(
    modules: Sequence[str] | None = None,
    include_c_modules: bool = True,
    include_topics: bool = True,
    max_total_chars: int = MAX_TOTAL_CHARS,
) -> tuple[list[str], list[str]]:
    """Return (train documents, validation documents), deterministically ordered."""
    docs = pack_documents(iter_module_texts(modules, include_c_modules, include_topics))
    kept: list[str] = []
    total = 0
    for doc in docs:
        if total + len(doc) > max_total_chars:
            break
        kept.append(doc)
        total += len(doc)
    train = [d for d in kept if not is_validation(d)]
    val = [d for d in kept if is_validation(d)]
    return train, val


def write_jsonl_gz(docs: Sequence[str], path: Path) -> int:
    """Write documents as gzip'd JSON lines with a fixed header (no mtime/name). Returns bytes."""
    buf = io.BytesIO()
    with gzip.GzipFile(filename="", mode="wb", fileobj=buf, compresslevel=9, mtime=0) as gz:
        for doc in docs:
            gz.write(json.dumps({"text": doc}, ensure_ascii=False).encode("utf-8") + b"\n")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(buf.getvalue())
    return len(buf.getvalue())


def read_jsonl_gz(path: Path) -> list[str]:
    with gzip.open(path, "rt", encoding="utf-8") as f:
        return [json.loads(line)["text"] for line in f if line.strip()]


# ---------------------------------------------------------------------- tokenizer


def tokenizer_config() -> dict[str, object]:
    """``tokenizer_config.json`` contents (read by torchtitan and transformers)."""
    added = {
        str(i): {
            "content": tok,
            "lstrip": False,
            "normalized": False,
            "rstrip": False,
            "single_word": False,
            "special": True,
        }
        for i, tok in enumerate(SPECIAL_TOKENS)
    }
    return {
        "add_bos_token": False,
        "add_eos_token": False,
        "add_prefix_space": False,
        "added_tokens_decoder": added,
        "bos_token": BOS_TOKEN,
        "clean_up_tokenization_spaces": False,
        "eos_token": EOS_TOKEN,
        "errors": "replace",
        "model_max_length": 131072,
        "pad_token": EOS_TOKEN,
        "split_special_tokens": False,
        "tokenizer_class": "PreTrainedTokenizerFast",
        "unk_token": None,
    }


def train_tokenizer(texts: Sequence[str], out_dir: Path, vocab_size: int = VOCAB_SIZE) -> Path:
    """Train a Qwen-style byte-level BPE on ``texts`` and save it into ``out_dir``."""
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors
    from tokenizers.trainers import BpeTrainer

    tok = Tokenizer(models.BPE(unk_token=None, fuse_unk=False, byte_fallback=False))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(PRETOKENIZE_REGEX), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer, length=len(texts))
    for i, special in enumerate(SPECIAL_TOKENS):
        assert tok.token_to_id(special) == i, (special, tok.token_to_id(special))

    out_dir.mkdir(parents=True, exist_ok=True)
    tok.save(str(out_dir / "tokenizer.json"), pretty=True)
    cfg = json.dumps(tokenizer_config(), indent=2, sort_keys=True, ensure_ascii=False)
    (out_dir / "tokenizer_config.json").write_text(cfg + "\n", encoding="utf-8")
    return out_dir


def chars_per_token(tokenizer_dir: Path, texts: Sequence[str]) -> float:
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(tokenizer_dir / "tokenizer.json"))
    n_tokens = sum(len(e.ids) for e in tok.encode_batch(list(texts), add_special_tokens=False))
    return sum(len(t) for t in texts) / max(n_tokens, 1)


# --------------------------------------------------------------------------- main


def build_assets(
    out_dir: Path = DEFAULT_ASSETS_DIR,
    modules: Sequence[str] | None = None,
    include_c_modules: bool = True,
    include_topics: bool = True,
    vocab_size: int = VOCAB_SIZE,
) -> AssetStats:
    """Build corpus, validation split and tokenizer into ``out_dir``."""
    train, val = build_corpus(modules, include_c_modules, include_topics)
    if not train:
        raise RuntimeError("no documents extracted from the standard library")
    out_dir = Path(out_dir)
    gz_bytes = write_jsonl_gz(train, out_dir / CORPUS_FILE)
    val_gz_bytes = write_jsonl_gz(val, out_dir / VAL_CORPUS_FILE)
    t0 = time.perf_counter()
    tok_dir = train_tokenizer(train, out_dir / TOKENIZER_SUBDIR, vocab_size)
    train_s = time.perf_counter() - t0
    from tokenizers import Tokenizer

    vocab = Tokenizer.from_file(str(tok_dir / "tokenizer.json")).get_vocab_size()
    return AssetStats(
        train_docs=len(train),
        val_docs=len(val),
        train_chars=sum(map(len, train)),
        val_chars=sum(map(len, val)),
        corpus_gz_bytes=gz_bytes,
        val_gz_bytes=val_gz_bytes,
        vocab_size=vocab,
        tokenizer_train_s=round(train_s, 2),
        chars_per_token=round(chars_per_token(tok_dir, train), 3),
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_ASSETS_DIR, help="output directory")
    parser.add_argument("--modules", default=None, help="comma-separated top-level modules (subset)")
    parser.add_argument("--no-c-modules", action="store_true", help="skip C-module docstrings")
    parser.add_argument("--no-topics", action="store_true", help="skip pydoc help() topics")
    parser.add_argument("--vocab-size", type=int, default=VOCAB_SIZE)
    args = parser.parse_args(argv)
    modules = [m for m in args.modules.split(",") if m] if args.modules else None
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "true")
    stats = build_assets(args.out, modules, not args.no_c_modules, not args.no_topics, args.vocab_size)
    print(json.dumps(asdict(stats), indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
