"""Image rows for vision-language models (issue 36, the data side): every shape users have, normalised to
the one TRL trains VLMs from, each image opened and checked while the rows are converted (before any model
loads; ``mode=plan`` runs the same conversion).

The canonical row (what TRL 1.16's ``DataCollatorForVisionLanguageModeling`` and
``prepare_multimodal_messages`` read): conversational ``messages`` (``prompt``/``chosen``/``rejected`` for
preference pairs) whose turns' ``content`` is a list of parts, ``{"type": "image"}`` placeholders and
``{"type": "text", "text": ...}``, plus an ``images`` column: the row's images in placeholder order, stored
as the ``datasets`` ``Image()`` feature with their bytes (``{"bytes", "path": None}``), so the
prepared-data cache and the worker processes carry them and a row reads back as PIL images. Every turn of
a row with images has list content (TRL inserts images before a *string* user turn, so string turns beside
placeholders would be counted twice); rows without images keep text content and an empty ``images`` list.

The shapes read (``data.images`` on):

- OpenAI-style content parts ``{"type": "image_url", "image_url": {"url": ...}}`` (also
  ``"image_url": "..."``, ``{"type": "image", "image": ...}``, ``{"type": "input_image", ...}``): a local
  path, a ``file://`` URL or a ``data:image/...;base64,`` URL;
- an ``images`` column (a list, or one image; LLaVA, ShareGPT-4V, LLaMA-Factory) with ``<image>``
  placeholders in the text or bare ``{"type": "image"}`` parts;
- ``datasets`` ``Image`` features (``{"bytes", "path"}``; parquet, save_to_disk), in an ``images`` or
  ``image`` column.

Relative paths are resolved against the data file's folder (a LLaMA-Factory dir: the dataset_info.json's
folder, as its ``media_dir`` defaults). A missing file, a path that is not a regular file (a FIFO: never
read), unreadable bytes, an http(s) URL (nothing is downloaded) and a placeholder count that differs from
the image count are row errors naming the file, line and column. ``data.image_max_pixels`` downsizes larger
images (aspect kept, PNG) and counts them.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import hashlib
import io
import math
import re
import stat
import statistics
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

from hydratune.components.config.errors import ConfigError
from hydratune.components.data.readers import RowError, Table

#: the content-part types that carry (or stand for) an image
IMAGE_PARTS = ("image", "image_url", "input_image")
#: the text placeholder of LLaVA / ShareGPT-4V / LLaMA-Factory rows
PLACEHOLDER = "<image>"
#: the canonical column of a row's images (TRL's ``images``); ``image`` (one image) is read too
IMAGES_COLUMN = "images"
IMAGE_COLUMNS = ("images", "image")
#: the suffixes of image files (a missing file named with one is still in the cache key: ``referenced_files``)
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".gif", ".bmp", ".webp", ".tif", ".tiff", ".ppm", ".ico")
#: what the model component declares when it takes images (``data.images=null`` follows it)
CAPABILITY = "accepts_images"


def image_feature() -> Any:
    """The Arrow type of the canonical ``images`` column: a list of ``datasets`` images (bytes kept)."""
    from datasets import Image, List

    return List(Image())


def with_images(data: Any, model: Any) -> Any:
    """``data`` with ``images`` decided: ``data.images`` when set, else (null: auto) whether the model
    component declares it takes images (its ``accepts_images``; a text model has none: False). A data option
    that reads no images (``reads_images`` False) is left as it is (``validate`` refuses ``images=true``).
    ``data.images=true`` with a model that declares ``accepts_images = False`` is refused; one that declares
    nothing (today's ``CausalLM``) is not judged here."""
    asked = getattr(data, "images", None)
    if not getattr(data, "reads_images", False) or asked is False:
        return data  # nothing to decide: the model's config is not read
    declared = getattr(model, CAPABILITY, None)  # a ClassVar, a property or a method
    declared = declared() if callable(declared) else declared
    if asked and declared is False:
        raise ConfigError(
            f"data.images=true, and the model ({type(model).__name__}) does not take images",
            key="data.images",
            hint="use a vision-language model, or data.images=false (image parts are then refused by name)",
        )
    return data if asked is not None else dataclasses.replace(data, images=bool(declared))


def rows_have_images(split: Any) -> bool:
    """Whether any row of ``split`` has an image (the ``images`` lists' lengths: no image decoded)."""
    if IMAGES_COLUMN not in split.column_names:
        return False
    import pyarrow.compute as pc

    found = split.with_format("arrow")[IMAGES_COLUMN]
    return bool(pc.sum(pc.list_value_length(found)).as_py() or 0)


def expanded_image_tokens(processor: Any) -> set[int]:
    """The ids of the tokens a ``processor`` expands each image into, as transformers marks them
    (``ProcessorMixin.image_token_ids``, the ids of ``mm_token_type_ids``; else its ``image_token_id``). Not
    always ``image_token_id``: Gemma 3's is the ``<start_of_image>`` placeholder, once per image, while an
    image expands to 256 ``<image_soft_token>``."""
    found = getattr(processor, "image_token_ids", None) or [getattr(processor, "image_token_id", None)]
    return {t for t in found if isinstance(t, int)}


def measured_image_tokens(processor: Any, split: Any, limit: int = 64) -> list[int]:
    """The image tokens the model's ``processor`` makes of each of the first ``limit`` rows of ``split``
    that have images (its ``expanded_image_tokens`` counted in the rendered, expanded row): what the memory
    estimate's ``model.image_tokens_per_row`` stands for. ``[]`` when the processor names no image token."""
    import pyarrow.compute as pc
    from trl.data_utils import prepare_multimodal_messages

    tokens = expanded_image_tokens(processor)
    if not tokens or IMAGES_COLUMN not in split.column_names:
        return []
    lengths = pc.list_value_length(split.with_format("arrow")[IMAGES_COLUMN]).to_pylist()
    picked = [i for i, n in enumerate(lengths) if n][:limit]
    column = "messages" if "messages" in split.column_names else "prompt"
    counts = []
    for row in split.select(picked):
        turns = prepare_multimodal_messages(row[column], images=row[IMAGES_COLUMN])
        ids = processor.apply_chat_template(turns, tokenize=True, return_dict=True)["input_ids"]
        ids = ids[0] if ids and isinstance(ids[0], list) else ids
        counts.append(sum(t in tokens for t in ids))
    return counts


# ------------------------------------------------------------------------------------- one row's images


@dataclass(frozen=True)
class TableImages:
    """What every row of one table shares: the folder its relative image paths are resolved against (None:
    a hub split's, only absolute paths) and data.image_max_pixels. ``row()`` starts one row's images."""

    folder: Path | None = None
    max_pixels: int | None = None

    @classmethod
    def of(cls, table: Table, max_pixels: int | None) -> TableImages:
        """A table's: its ``image_dir`` (a LLaMA-Factory dir), else its file's folder (``table_folder``)."""
        return cls(table.image_dir or table_folder(table.source), max_pixels)

    def row(self) -> RowImages:
        """A fresh collector for the next row of this table."""
        return RowImages(self)


@dataclass
class RowImages:
    """One row's images, collected as its conversion meets them and handed back with it (``convert_range``
    makes one per row, the option's conversion fills it, ``ImageCounts.add_row`` counts it): image refs
    given inside content parts (in order), bare placeholders (``<image>`` text, ``{"type": "image"}``
    parts) waiting for the images column; once loaded, the images' pixel counts and how many were
    resized."""

    table: TableImages = field(default_factory=TableImages)
    inline: list[tuple[Any, str]] = field(default_factory=list)  # (the ref, where it was)
    bare: int = 0
    pixels: list[int] = field(default_factory=list)
    resized: int = 0

    def split_text(self, text: str) -> list[dict[str, Any]]:
        """Text with ``<image>`` placeholders as parts (counted as bare placeholders)."""
        parts: list[dict[str, Any]] = []
        for k, piece in enumerate(text.split(PLACEHOLDER)):
            if k:
                parts.append({"type": "image"})
                self.bare += 1
            if piece:
                parts.append({"type": "text", "text": piece})
        return parts

    def content_parts(self, value: Any, i: int, column: str) -> str | list[dict[str, Any]]:
        """A turn's content with images allowed: text (returned as it is when it holds no ``<image>``), or
        parts: text parts kept (``<image>`` inside them split off), image parts as ``{"type": "image"}``
        placeholders (the image each carries noted here, in order). Other part types (audio, file) are a
        ``RowError``."""
        if isinstance(value, str):
            return self.split_text(value) if PLACEHOLDER in value else value
        out: list[dict[str, Any]] = []
        for j, part in enumerate(value):
            if isinstance(part, str):
                out += self.split_text(part)
                continue
            kind = part.get("type", "text") if isinstance(part, dict) else type(part).__name__
            if kind == "text" and isinstance(part.get("text"), str):
                out += self.split_text(part["text"])
                continue
            if kind not in IMAGE_PARTS:
                raise RowError(
                    f"message {i} in column '{column}' has a '{kind}' content part (part {j}): only text and "
                    "image parts can be trained",
                    key="data.path",
                    hint="drop the other parts (audio, files) from the data, or set data.on_error=skip to "
                    "drop such rows and count them",
                )
            payload = _payload(part)
            if payload is None:
                self.bare += 1
            else:
                self.inline.append((payload, f"message {i} in column '{column}', part {j}"))
            out.append({"type": "image"})
        return out

    def finish(self, row: dict[str, Any], lists: dict[str, list[dict[str, Any]]]) -> list[dict[str, Any]]:
        """The row's images, loaded and checked, in placeholder order: from its content parts, or (bare
        placeholders) from its ``images`` / ``image`` column; placeholders and images must agree in number.
        With images, every turn of ``lists`` (the converted message lists, changed in place) gets list
        content."""
        column = next((c for c in IMAGE_COLUMNS if c in row and not _blank(row[c])), None)
        given = _column_images(row[column], column) if column else []
        if self.inline and (given or self.bare):
            what = f"column '{column}' holds {len(given)}" if given else f"{self.bare} placeholders have none"
            raise RowError(
                f"the row gives images both inside its content parts ({len(self.inline)}) and apart from "
                f"them ({what}): give each image once",
                key="data.path",
                hint="either image parts that carry their image (image_url), or placeholders (<image> or "
                '{"type": "image"}) with an images column',
            )
        refs = self.inline or [(image, f"column '{column}' item {k}") for k, image in enumerate(given)]
        if not self.inline and self.bare != len(given):
            found = f"column '{column}' holds {len(given)}" if column else "the row has no images column"
            raise RowError(
                f"the row has {self.bare} image placeholder{'' if self.bare == 1 else 's'} (<image> or "
                f'{{"type": "image"}}) and {len(given)} image{"" if len(given) == 1 else "s"} ({found}): '
                "each placeholder takes one image, in order",
                key="data.path",
                hint="put one placeholder (<image>) where each image goes, in order, or set "
                "data.on_error=skip to drop such rows and count them",
            )
        images = [self.load_image(ref, where) for ref, where in refs]
        if images:
            for turns in lists.values():
                for turn in turns:
                    turn["content"] = as_parts(turn["content"])
        return images

    def load_image(self, ref: Any, where: str) -> dict[str, Any]:
        """One image as the ``Image()`` feature stores it (``{"bytes", "path": None}``), opened and fully
        decoded first; larger than data.image_max_pixels: downsized (aspect kept), saved as PNG and counted
        here. ``ref``: a path (relative: to the table's folder), a ``file://`` or ``data:`` URL, ``{"bytes",
        "path"}`` (a ``datasets`` image), a PIL image."""
        data, name = _bytes_of(ref, where, self.table.folder)
        from PIL import Image

        try:
            with Image.open(io.BytesIO(data)) as image:
                image.load()  # decodes every pixel: truncated or corrupt data fails here
                width, height = image.size
                limit = self.table.max_pixels
                if limit and width * height > limit:
                    scale = math.sqrt(limit / (width * height))
                    size = (max(1, int(width * scale)), max(1, int(height * scale)))
                    smaller = image.convert("RGBA" if "A" in image.getbands() else "RGB").resize(
                        size, Image.Resampling.LANCZOS
                    )
                    out = io.BytesIO()
                    smaller.save(out, format="PNG")
                    data, (width, height) = out.getvalue(), size
                    self.resized += 1
        except unreadable_image_errors() as err:
            raise RowError(
                f"{where}: {name} is not a readable image ({type(err).__name__}: {err})",
                key="data.path",
                hint="replace the file with a valid PNG / JPEG / WebP..., or set data.on_error=skip to drop "
                "such rows and count them",
            ) from None
        self.pixels.append(width * height)
        return {"bytes": data, "path": None}


def unreadable_image_errors() -> tuple[type[BaseException], ...]:
    """What PIL raises for bytes that are no image, a truncated one, or a decompression bomb (more pixels
    than ``PIL.Image.MAX_IMAGE_PIXELS`` twice over)."""
    from PIL import Image, UnidentifiedImageError

    return (UnidentifiedImageError, OSError, ValueError, Image.DecompressionBombError)


def open_image_file(path: Path, where: str) -> Any:
    """The image file at ``path`` as an RGB PIL image, checked as a training row's image is (a regular file,
    fully decoded, no decompression bomb); a RowError naming it otherwise (``where``: whose image)."""
    data, name = _bytes_of(str(path), where, None)
    from PIL import Image

    try:
        with Image.open(io.BytesIO(data)) as image:
            image.load()
            return image.convert("RGB")
    except unreadable_image_errors() as err:
        raise RowError(f"{where}: {name} is not a readable image ({type(err).__name__}: {err})") from None


def table_folder(source: str) -> Path | None:
    """The folder a table's relative image paths are resolved against: a file's folder, a save_to_disk
    folder itself (``source`` may end with ``[split]``); None for a hub split."""
    path = Path(re.sub(r"\[[^\]]*\]$", "", source)).expanduser()
    if path.is_file():
        return path.parent
    return path if path.is_dir() else None


def _payload(part: dict[str, Any]) -> Any:
    """The image a content part carries (a URL, a path, bytes...), None for a bare placeholder."""
    for key in ("image_url", "image", "url", "path"):
        value = part.get(key)
        if isinstance(value, dict) and key == "image_url":
            value = value.get("url")
        if value is not None:
            return value
    return None


def as_parts(content: Any) -> list[dict[str, Any]]:
    """A turn's content as parts (text becomes one text part; blank text none)."""
    if isinstance(content, list):
        return content
    return [{"type": "text", "text": content}] if content else []


def text_of_content(content: Any) -> str:
    """The text of a turn's content (parts: the text parts joined)."""
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if p.get("type") == "text")
    return str(content)


def _blank(value: Any) -> bool:
    return value is None or value == [] or (isinstance(value, float) and math.isnan(value))


def _column_images(value: Any, column: str) -> list[Any]:
    """The images a row's ``images`` / ``image`` cell holds, as a list (one image becomes one)."""
    if isinstance(value, str) and value.lstrip().startswith("["):  # a csv cell holding JSON
        import json

        try:
            value = json.loads(value)
        except ValueError as err:
            raise RowError(f"column '{column}' holds malformed JSON ({err})") from None
    return list(value) if isinstance(value, (list, tuple)) else [value]


# ------------------------------------------------------------------------------------ one image


def _bytes_of(ref: Any, where: str, folder: Path | None) -> tuple[bytes, str]:
    """(the image's bytes, how to name it in an error); a relative path is read from ``folder``."""
    if isinstance(ref, dict) and ("bytes" in ref or "path" in ref):  # a datasets Image
        if ref.get("bytes"):
            return bytes(ref["bytes"]), "the image bytes"
        ref = ref.get("path")
    if hasattr(ref, "save") and hasattr(ref, "size"):  # a PIL image (a decoded datasets Image)
        out = io.BytesIO()
        ref.save(out, format="PNG")
        return out.getvalue(), "the image"
    if isinstance(ref, (bytes, bytearray)):
        return bytes(ref), "the image bytes"
    if not isinstance(ref, str) or not ref.strip():
        raise RowError(
            f"{where}: an image should be a path or URL, got {type(ref).__name__}", key="data.path"
        )
    if ref.startswith("data:"):
        head, _, body = ref.partition(",")
        if ";base64" not in head:
            raise RowError(f"{where}: a data URL of an image should be base64 ({head}...)", key="data.path")
        try:
            return base64.b64decode(body, validate=True), "the data: URL's image"
        except (binascii.Error, ValueError) as err:
            raise RowError(f"{where}: the data: URL is not valid base64 ({err})", key="data.path") from None
    scheme = urlparse(ref).scheme.lower()
    if scheme in ("http", "https", "ftp", "s3", "gs"):
        raise RowError(
            f"{where}: the image {ref} is a {scheme} URL; nothing is downloaded while preparing the data",
            key="data.path",
            hint="download the images and give their paths (relative to the data file, or absolute), or "
            "set data.on_error=skip to drop such rows and count them",
        )
    path = Path(unquote(urlparse(ref).path) if scheme == "file" else ref).expanduser()
    if not path.is_absolute() and folder is not None:
        path = folder / path
    try:
        if not stat.S_ISREG(path.stat().st_mode):  # a FIFO, a device: reading could block forever
            raise RowError(
                f"{where}: the image {path} is not a regular file ({_file_kind(path)}); it is not read",
                key="data.path",
                hint="point the row at the image file itself, or set data.on_error=skip to drop such rows "
                "and count them",
            )
        return path.read_bytes(), str(path)
    except FileNotFoundError:
        raise RowError(
            f"{where}: the image file {path} does not exist",
            key="data.path",
            hint="relative image paths are read from the data file's folder; fix the path, or set "
            "data.on_error=skip to drop such rows and count them",
        ) from None
    except OSError as err:
        raise RowError(
            f"{where}: cannot read the image file {path} ({err.strerror})", key="data.path"
        ) from None


def _file_kind(path: Path) -> str:
    """What a path that is not a regular file is, in words."""
    mode = path.stat().st_mode
    kinds = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"))
    kinds += ((stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"))
    return next((name for test, name in kinds if test(mode)), "not a regular file")


# ------------------------------------------------------------------------------------- the report


@dataclass
class ImageCounts:
    """What a conversion met, summed over its ranges: rows with images, images per row, pixels, resized."""

    rows: int = 0
    most: int = 0
    resized: int = 0
    pixels: list[int] = field(default_factory=list)

    def add_row(self, row: RowImages) -> None:
        if row.pixels:
            self.rows += 1
            self.most = max(self.most, len(row.pixels))
            self.resized += row.resized
            self.pixels += row.pixels

    def merge(self, other: ImageCounts) -> None:
        self.rows += other.rows
        self.most = max(self.most, other.most)
        self.resized += other.resized
        self.pixels += other.pixels

    def note(self, total_rows: int, max_pixels: int | None) -> str:
        """The summary's (and ``mode=plan``'s) line."""
        if not self.pixels:
            return f"none in {total_rows:,} rows"
        p = self.pixels
        line = (
            f"{len(p):,} in {self.rows:,} of {total_rows:,} rows (at most {self.most} per row); pixels per "
            f"image min {min(p):,}, median {int(statistics.median(p)):,}, max {max(p):,}"
        )
        if max_pixels:
            line += f"; {self.resized:,} downsized to data.image_max_pixels={max_pixels:,}"
        return line


# ------------------------------------------------------------------------------------- the cache key


def referenced_files(
    files: list[Path], roots: list[Path], remember: Path | None, digest: Callable[[Path], str]
) -> list[Path]:
    """The image files the rows of data ``files`` (JSON, JSON lines, csv, each maybe compressed; parquet,
    Arrow) may name: every string value of every row (nested ones too: a csv cell holding JSON, an Arrow
    ``{"bytes", "path"}`` struct) that is a path or ``file://`` URL of an existing file, or of a missing
    one with an image suffix, relative to the data file's folder or one of ``roots``. A superset of what the
    conversion reads (the cache key hashes them: an image whose bytes change gives another key though the
    data file did not change). Remembered per data file's sha256 (``digest``) under ``remember``."""
    import json

    from hydratune.components.data.file_bytes import file_type

    found: dict[str, None] = {}
    for data_file in files:
        if file_type(data_file) is None:
            continue
        record = None
        if remember is not None:
            stamp = f"{digest(data_file)}|{data_file.resolve()}|{[str(r.resolve()) for r in roots]}"
            key = hashlib.sha256(stamp.encode()).hexdigest()[:32]
            record = remember / f"images-{key}.json"
            try:
                found.update(dict.fromkeys(json.loads(record.read_text())))
                continue
            except (OSError, ValueError):
                pass
        mine: dict[str, None] = {}
        folders = [data_file.parent, *roots]
        for value in _strings(data_file):
            path = Path(unquote(urlparse(value).path) if value.startswith("file://") else value).expanduser()
            for folder in [Path()] if path.is_absolute() else folders:
                candidate = folder / path
                try:  # a missing image too (on_error=skip dropped its row): the key changes when it appears
                    named = candidate.is_file() or candidate.suffix.lower() in IMAGE_SUFFIXES
                    if named and candidate.resolve() != data_file.resolve():
                        mine[str(candidate.resolve())] = None
                except (OSError, ValueError):  # a name no file can have (a NUL, too long)
                    continue
        found.update(mine)
        if record is not None:
            try:
                record.parent.mkdir(parents=True, exist_ok=True)
                record.write_text(json.dumps(list(mine)))
            except OSError:  # a read-only cache still works
                pass
    return [Path(p) for p in found]


def _walk(value: Any) -> Iterator[str]:
    """The short one-line strings in a row's value, nested ones too (a csv cell's JSON list included)."""
    import json

    if isinstance(value, str):
        if value.lstrip().startswith(("[", "{")):  # a csv cell holding JSON (_column_images reads it so)
            try:
                yield from _walk(json.loads(value))
                return
            except ValueError:
                pass
        if 0 < len(value) < 1024 and "\n" not in value and not value.startswith("data:"):
            yield value
    elif isinstance(value, dict):
        for v in value.values():
            yield from _walk(v)
    elif isinstance(value, (list, tuple)):
        for v in value:
            yield from _walk(v)


def _strings(data_file: Path) -> Iterator[str]:
    """The candidate paths of a data file: the short one-line strings of a JSON lines file (a line at a
    time), a JSON document (parsed whole, as the reader parses it), a csv file (every cell), a parquet or
    Arrow file (every row, a record batch at a time). A file that cannot be read so yields what was read
    before (the reader refuses it by name when the rows are read)."""
    try:
        yield from _read_strings(data_file)
    except Exception:  # each format's library raises its own error for a damaged file
        return


def _read_strings(data_file: Path) -> Iterator[str]:
    import csv
    import io
    import json
    import sys

    from hydratune.components.data.file_bytes import file_type, open_compressed

    suffix, compression = file_type(data_file) or (data_file.suffix.lower(), None)
    if suffix in (".parquet", ".arrow"):
        for batch in _record_batches(data_file, suffix):
            yield from _walk(batch.to_pylist())
        return
    raw = open_compressed(data_file, compression) if compression else data_file.open("rb")
    with io.TextIOWrapper(raw, encoding="utf-8-sig", errors="replace", newline="") as text:
        if suffix == ".csv":
            limit = csv.field_size_limit(sys.maxsize)  # a long text cell is read, as the reader reads it
            try:
                for row in csv.reader(text):
                    yield from _walk(row)
            finally:
                csv.field_size_limit(limit)
            return
        if suffix == ".json":
            whole = text.read()
            try:
                yield from _walk(json.loads(whole))
                return
            except ValueError:
                text = io.StringIO(whole)  # JSON lines in a .json file
        for line in text:
            try:
                yield from _walk(json.loads(line))
            except ValueError:
                continue


def _record_batches(data_file: Path, suffix: str) -> Iterator[Any]:
    """A parquet or Arrow file (``datasets``' IPC stream, or the IPC file format) a record batch at a time."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    if suffix == ".parquet":
        yield from pq.ParquetFile(data_file).iter_batches(batch_size=1024)
        return
    with pa.memory_map(str(data_file)) as source:
        try:
            reader: Any = pa.ipc.open_stream(source)
        except pa.ArrowInvalid:
            source.seek(0)
            file_reader = pa.ipc.open_file(source)
            yield from (file_reader.get_batch(i) for i in range(file_reader.num_record_batches))
            return
        yield from reader


def check_combination(data: Any) -> None:
    """What image rows cannot do yet, refused before load: data.streaming (a stream is tokenized and
    packed as it trains)."""
    if getattr(data, "images", False) and getattr(data, "streaming", False):
        raise ConfigError(
            "data.streaming does not read image rows (a stream is tokenized and packed as it trains; image "
            "rows go to the model's processor batch by batch)",
            key="data.streaming",
            hint="data.streaming=false, or data.images=false for text-only data with a vision-language model",
        )
