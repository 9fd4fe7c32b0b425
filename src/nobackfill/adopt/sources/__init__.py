"""Streaming readers of vectors embedded elsewhere ("bring your own index").

:func:`open_source` opens one of::

    clip-retrieval:DIR       clip-retrieval ``inference`` output (img_emb/, text_emb/, metadata/)
    npy:FILE.npy             a (rows, dim) array, with ``table`` = ids and sources, row for row
    npz:FILE.npz[:KEY]       one array of an .npz (KEY, or its only array), with ``table``
    faiss:FILE               a faiss index (vectors reconstructed), ``table`` optional for an IDMap

and gives an :class:`ImportSource`: ``.rows``, ``.dim``, ``.describe()``, ``.warnings`` and
``.batches(start_row)``, which yields :class:`ImportBatch` es of at most ``batch_rows`` items with
unit float32 vectors. Memory stays bounded by one batch beyond the vectors: ``.npy`` files are
memory-mapped, parquet read in record batches, JSONL / CSV line by line (an ``.npz`` array and a
faiss index are loaded whole: that is how numpy and faiss read them). The only whole-file structure
is the ids seen, for duplicate detection: a sorted array of their 64-bit hashes (8 bytes a row); a
hit on a table id is confirmed against the table before it is reported.

**Rows.** A source's rows are its items in a fixed order; ``start_row`` (0-based) resumes there.
A table source has one item per table row. A clip-retrieval folder has, per metadata row, an
image item (when ``img_emb`` exists) then a caption item (when ``text_emb`` exists), shard after
shard: with both, item row ``2r`` is the image and ``2r + 1`` the caption of metadata row ``r``.
Error messages name the file and its own 1-based row (data rows: a CSV header and blank JSONL lines
are not counted).

**Ids** (never a row number):

* the table's id column when ``id_column`` names one (only then: a column called ``id`` is not
  taken by its name; a warning says it was left, and it stays in the metadata). A repeated id is
  a :class:`SourceError` naming both rows (:meth:`ImportSource.check_ids` reads the id column
  alone to find one before an import commits anything). In a clip-retrieval folder with images
  and captions, the id column names the images; a caption's id is then derived as below from its
  text and its image's id.
* otherwise the rule of ``collection add`` (:mod:`nobackfill.collection.ingest`): an image's id is
  :func:`~nobackfill.collection.ingest.image_id` of the sha256 of its bytes when the file is readable,
  otherwise ``"img-"`` + the first 20 hex digits of the sha256 of its path as written in the table
  (or of its url when it has no path); a caption's id is
  :func:`~nobackfill.collection.ingest.text_id` of its text and its image's id (of its text alone when
  it belongs to no image). Derived ids name content, so a row whose derived id was read before is
  the same item again (clip-retrieval repeats an image once per caption): it is yielded once, and
  ``.warnings`` counts the repeats after a full pass.
* a faiss IndexIDMap without a table: its int ids, as strings.

**Sources.** An image item's source is ``{"path": absolute path or "", "url": url (only when
there is one), "sha256": hex digest of its bytes (only when the file was readable)}``; a caption's
is ``{"text": caption}``; an item with nothing to re-embed from has ``{}``. **Metadata**: what
the source is (an image's ``path`` and ``url``, a caption's ``text``, as ``add`` keeps them), and
the table's other columns (``metadata_columns``: only those named). Relative image paths are
resolved against ``images_root`` when given, otherwise against the table's folder (npy / npz /
faiss tables) or the current directory (clip-retrieval, whose paths are as given to its run).

**Validation**, each a :class:`SourceError` naming the file and the row, before anything is
yielded where possible (vectors are scanned when the source opens): a table whose row count
differs from the vector count, NaN / inf, an all-zero vector, a width other than ``expect_dim``
(checked by :func:`open_source` when given), a missing column (naming the columns that exist), a
duplicate id (raised while streaming). Vectors that are not unit length (norm off by more than
:data:`NORM_TOLERANCE`) are normalised, with one message in ``.warnings`` saying how many rows were;
every yielded vector is unit length (a row already unit to float32 rounding is kept bit for bit).
The width is checked against the model here only when ``expect_dim`` is given; otherwise the caller
compares ``.dim`` with the model's width.

May import: ``ann``, ``catalog``, ``collection``, ``gallery``.
"""

from __future__ import annotations

# The readers live in submodules: common (the error, the batch, shared limits), tables (parquet /
# JSONL / CSV tables), vectors (npy / npz arrays, the scan, unit rows), items (the id and source
# rules), import_source (ImportSource: batches, duplicates), clip_retrieval, table_source (npy / npz
# with a table), faiss_reader (faiss indexes) and entry (open_source). A constant is looked up in the
# module that uses it: patch it there.
from .clip_retrieval import ClipRetrievalSource
from .common import FAISS_EXACT, NORM_TOLERANCE, ImportBatch, SourceError, SourceNotFound
from .entry import open_source
from .import_source import ImportSource, _SeenIds
from .table_source import TableSource

__all__ = ["FAISS_EXACT", "NORM_TOLERANCE", "ImportBatch", "ImportSource", "SourceError", "SourceNotFound",
           "open_source", "ClipRetrievalSource", "TableSource", "_SeenIds"]
