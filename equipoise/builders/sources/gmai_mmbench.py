"""GMAI-MMBench: a VQA TSV with base64 images, copied out content-addressed."""

from __future__ import annotations

import base64
import binascii
import hashlib
import os
from pathlib import Path
from typing import Any

from equipoise.builders.sources.base import (
    Collector,
    Ctx,
    RowError,
    SourceKind,
    SourceSpec,
    make_item,
    open_location,
    opt_text,
    register,
    require_columns,
    split_from_name,
    text_field,
)
from equipoise.builders.sources.mini import SourceError
from equipoise.schemas.items import LETTERS, ItemMetadata, MCQItem

GMAI_DEFAULT_FILES = ("GMAI_mm_bench_VAL.tsv",)  # the TEST parts carry no 'answer' column


# ---------------------------------------------------------------------------------------------
# GMAI-MMBench: OpenGVLab/GMAI-MMBench (gated), GMAI_mm_bench_VAL.tsv with base64 images; the
# GMAI_mm_bench_TEST_part_*.tsv files have no 'answer' column.  Checked against the uni-medical README
# (answer only in VAL, base64 PNG images) and public readers of the file (columns index, question,
# A-E, answer, image, category, clinical VQA task, department, perceptual granularity, modality,
# original task).  Images are written content-addressed as <image_root>/images/<sha256>.<ext> and the
# item's ``image`` is that relative path; the record names the image_root.
# ---------------------------------------------------------------------------------------------
IMAGE_MAGIC = (
    (b"\x89PNG\r\n\x1a\n", "png"),
    (b"\xff\xd8\xff", "jpg"),
    (b"GIF8", "gif"),
    (b"BM", "bmp"),
)


def default_image_root() -> Path:
    base = os.environ.get("EQUIPOISE_CACHE") or str(Path.home() / ".cache" / "equipoise")
    return Path(base) / "gmai_mmbench"


def image_extension(data: bytes) -> str | None:
    """File extension for image bytes, told from their magic number (None: not a known image kind).

    Shared with the suite builder, which names copied images by content the same way."""
    ext = next((e for magic, e in IMAGE_MAGIC if data.startswith(magic)), None)
    if ext is None and data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        ext = "webp"
    return ext


def save_image(b64: str, root: Path) -> str:
    """Decode a base64 image, store it as ``root/images/<sha256>.<ext>``; return the relative path."""
    try:
        data = base64.b64decode(b64, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise RowError("image", f"not valid base64 ({exc})") from exc
    ext = image_extension(data)
    if ext is None:
        raise RowError("image", "decoded bytes are not a PNG, JPEG, GIF, BMP or WebP image")
    rel = f"images/{hashlib.sha256(data).hexdigest()}.{ext}"
    path = root / rel
    if not (path.is_file() and path.stat().st_size == len(data)):
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(path.suffix + f".tmp{os.getpid()}")
        tmp.write_bytes(data)
        os.replace(tmp, path)
    return rel


def gmai_row(
    row: dict[str, Any],
    ctx: Ctx,
    letters: list[str],
    image_root: Path,
    images: dict[str, str],
    pending: list[tuple[MCQItem, str, str]],
    col: Collector,
) -> MCQItem | None:
    """{index, question, A..E (empty when absent), answer letter, image base64, category, clinical VQA
    task, department, perceptual granularity, modality, original task} -> item (None: skipped)."""
    index = text_field(row, "index")
    question = text_field(row, "question")
    present = [(i, letter, opt_text(row.get(letter))) for i, letter in enumerate(letters)]
    options = [(i, t) for i, _, t in present if t is not None]
    if len(options) < 2:
        col.skipped("fewer_than_2_options")
        return None
    answer = opt_text(row.get("answer"))
    if answer is None:
        raise RowError("answer", "missing answer")
    answer = answer.upper()
    kept = [letter for _, letter, t in present if t is not None]
    if answer not in kept:
        raise RowError("answer", f"answer {answer!r} is not among the non-empty options {kept}")
    raw_image = opt_text(row.get("image"))
    if raw_image is None:
        raise RowError("image", "missing image")
    ref = raw_image if len(raw_image) <= 64 and raw_image.isdigit() else None  # MMBench: image of another row
    image = None if ref else save_image(raw_image, image_root)
    if image:
        images[index] = image
    item = make_item(
        ctx,
        item_id=f"gmai-{ctx.split}-{index}",
        source_id=index,
        question=question,
        options=options,
        gold=kept.index(answer),
        image=image or "pending",
        metadata=ItemMetadata(
            specialty=opt_text(row.get("department")), imaging_modality=opt_text(row.get("modality"))
        ),
    )
    if ref:
        pending.append((item, ref, f"row {ctx.n}"))
    return item


def _load_gmai(spec: SourceSpec) -> tuple[list[MCQItem], dict[str, str]]:
    image_root = Path(spec.params["images"]) if spec.params.get("images") else default_image_root()
    files = spec.list_param("files") or list(GMAI_DEFAULT_FILES)
    hub_files: dict[str, list[str]] = {}
    for f in files:
        s = split_from_name(f)
        if s is None:
            raise SourceError(f"source spec: cannot tell the split of {f!r} from its name")
        hub_files.setdefault(s, []).append(f)
    kw = {"sep": "\t", "keep_default_na": False, "na_values": [""]}
    opened = open_location(
        spec,
        config=spec.params.get("config"),
        data_glob="*.tsv",
        name_filter=lambda p: p.name in files,
        hub_data_files=hub_files,
        builder_kwargs=kw,
        header_features=True,
    )
    col = Collector(spec)
    for part in opened.parts:
        require_columns(part, ["index", "question", "A", "B", "answer", "image"])
        letters = [c for c in LETTERS if c in part.rows.column_names]
        if letters != list(LETTERS[: len(letters)]):
            raise SourceError(
                f"{part.where}: row 1: field 'options': option columns {letters} are not A, B, ..."
            )
        images: dict[str, str] = {}
        pending: list[tuple[MCQItem, str, str]] = []
        ctx = Ctx(dataset="gmai_mmbench", prefix="gmai", split=part.split, revision=opened.revision)
        col.run(
            part, ctx, lambda r, c, i=images, p=pending, lt=letters: gmai_row(r, c, lt, image_root, i, p, col)
        )
        position = {it.item_id: k for k, it in enumerate(col.items)}
        for item, ref, where in pending:
            if ref not in images:
                raise SourceError(
                    f"{part.where}: {where}: field 'image': refers to row index {ref}, which has no image"
                )
            col.items[position[item.item_id]] = item.model_copy(update={"image": images[ref]})
    return col.items, col.record(
        "gmai_mmbench", opened.revision, spec, image_root=str(image_root), **opened.notes
    )


register(SourceKind("gmai_mmbench", _load_gmai, frozenset({"images", "files"}), summary="GMAI-MMBench"))
