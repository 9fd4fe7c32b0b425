"""Writing a collection: item commits (:meth:`CollectionWrites.commit`, the bulk
:meth:`CollectionWrites.commit_rows`), vectors stored and served (:meth:`CollectionWrites.put_vectors`),
new spaces and plan changes, each one catalog transaction. A mixin of
:class:`~nobackfill.collection.collection.Collection`."""

from __future__ import annotations

import contextlib
from itertools import repeat
from operator import itemgetter
from typing import Callable, Iterable, Iterator, Mapping, Sequence

import numpy as np

from ..gallery.atomic_files import _now
from ..catalog.catalog import Writer
from ..catalog.items import Item, ItemNotFoundError, _item_json, _row_json
from .placement import SPACE_DIR, _first_holders, _row_of, _space_dirname, _space_entry
from ..catalog.plan import Plan, PlanError, Space
from ..storage.base import SpaceStore
from ..gallery.manifest import MODALITIES

__all__ = ["CollectionWrites"]

def _zero() -> int:
    return 0


#: commits made by this process (readers of other Collection objects then re-check at once)
_WRITES = [0]


class CollectionWrites:
    """The writers of a :class:`~nobackfill.collection.collection.Collection` (which sets ``storage``,
    ``catalog``, ``path``, ``_header``, ``_lock``, ``_galleries`` and ``gallery``). A commit records
    the largest write timestamp of the stores this process opened (``commit_ts``: Milvus), in its
    own transaction."""

    @contextlib.contextmanager
    def _writing(self) -> Iterator[Writer]:
        """One catalog transaction; the in-memory header follows it once committed."""
        try:
            with self._lock, self.catalog.writing() as w:
                yield w
                if not w.unchanged:
                    ts = max((getattr(g, "commit_ts", _zero)() for g in list(self._galleries.values())), default=0)
                    if ts:  # readers wait for the vectors this commit names (Milvus), no longer
                        w.stamp_vectors(ts)
                    w.finish(_now())
        finally:
            _WRITES[0] += 1  # every reader of this process asks the catalog again
        self._header = self.catalog.header()

    def store_for_lookup(self, space_id: str, plan: Plan | None = None) -> SpaceStore:
        """The store of ``space_id`` ready for ``positions()`` to see the rows other processes stored:
        refreshed first, unless its ``positions()`` ask the server for the keys it does not know
        (``keys_from_catalog``: a Milvus store, where each refresh is a read of the server)."""
        g = self.gallery(space_id, plan)
        if not getattr(g, "keys_from_catalog", False):
            g.refresh()
        return g

    def _locate(self, plan: Plan, modality: str, keys: Sequence[str]) -> dict[str, tuple[str, int | None]]:
        """Key -> (space, row) of the first space in serving order whose store holds it; called inside
        the write transaction (a vector committed by a racing writer is seen, or that writer's own
        transaction finds this one's items), each store refreshed first."""
        return _first_holders(plan, modality, keys, lambda sid: self.store_for_lookup(sid, plan))

    def commit(self, puts: Sequence[Item] = (), deletes: Sequence[str] = (), *,
               missing_ok: bool = False) -> int:
        """Apply item puts (add or replace by id) and deletes in one atomic commit; returns the
        number of events written. Deleting an id that is not live raises
        :class:`ItemNotFoundError` (nothing is written) unless ``missing_ok``."""
        puts = list(puts)
        for it in puts:
            problem = it.problem()
            if problem:
                raise ValueError(problem)
        try:
            rows = [_item_json(it) for it in puts]
        except (TypeError, ValueError) as e:
            raise ValueError(f"item metadata must be JSON-serialisable: {e}") from None
        return self.commit_rows(rows, deletes, missing_ok=missing_ok)

    def commit_rows(self, rows: Sequence[tuple[str, str, str, str, str]], deletes: Sequence[str] = (), *,
                    missing_ok: bool = False, stored: tuple[str, Mapping[str, int]] | None = None,
                    skip_unchanged: bool = False) -> int:
        """:meth:`commit` of items given as catalog rows ``(id, modality, key, source JSON,
        metadata JSON)`` that the caller validated (the bulk path of
        :func:`~nobackfill.adopt.importing.add_vectors`). ``stored = (space, {key: row})``: where
        the caller just stored the rows' vectors; used (without asking the store) while that space
        is still the current one, which serves first. ``skip_unchanged``: rows equal to the live
        item are left alone (not counted)."""
        rows, deletes = list(rows), list(deletes)
        if not rows and not deletes:
            return 0
        with self._writing() as w:
            put_ids = set(map(itemgetter(0), rows))
            if len(put_ids) < len(rows):  # an id put twice: the last one
                rows = list({r[0]: r for r in rows}.values())
            plan = w.header["plan"]
            hint_space, hint = stored if stored is not None and stored[0] == plan.current else (None, {})
            new = 0

            def stored_rows(rs: Sequence[tuple]) -> list[tuple[str, int | None]]:  # (space, row) from the hint
                stable = getattr(self.gallery(hint_space, plan), "stable_positions", False)
                return list(zip(repeat(hint_space), map(hint.__getitem__, map(itemgetter(2), rs)) if stable
                                else repeat(None, len(rs))))

            if skip_unchanged and not deletes and hint_space is not None and \
                    all(map(hint.__contains__, map(itemgetter(2), rows))):
                # the bulk path: new ids go in at once, without a lookup each; the others below
                rids = w.insert(rows, stored_rows(rows), new_ids_only=True)
                rows = [r for r, rid in zip(rows, rids) if rid is None]
                new = len(rids) - len(rows)
                if not rows:
                    return new
                put_ids = {r[0] for r in rows}
            old = w.rows_by_id(list(put_ids | set(deletes)))
            if skip_unchanged and old:
                rows = [r for r in rows if r[0] not in old or _row_json(old[r[0]]) != r]
                put_ids = {r[0] for r in rows}
                if not rows and not deletes:
                    w.unchanged = not new  # nothing written: no new generation, readers keep their snapshot
                    return new
            missing = [i for i in deletes if i not in old and i not in put_ids]
            if missing and not missing_ok:
                raise ItemNotFoundError(f"no item with id {missing[0]!r} in collection {self.path}"
                                        + (f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""))
            gone = [old[i] for i in dict.fromkeys(deletes) if i in old and i not in put_ids]
            replaced = [old[r[0]] for r in rows if r[0] in old]
            w.delete(gone + replaced)
            placed: dict[tuple[str, str], tuple[str, int | None]] = {}
            for o in replaced:  # same content: the row that served it serves it again
                if o.space is not None and o.pos is not None:
                    placed[(o.modality, o.key)] = (o.space, o.pos)
            if hint_space is not None and not placed and all(r[2] in hint for r in rows):  # all just stored
                w.insert(rows, stored_rows(rows))
                return new + len(rows) + len(gone)
            for m in MODALITIES:
                keys = [r[2] for r in rows if r[1] == m]
                if placed:
                    keys = [k for k in keys if (m, k) not in placed]
                if hint_space is not None:
                    g = self.gallery(hint_space, plan)
                    placed.update(((m, k), (hint_space, _row_of(g, hint[k]))) for k in keys if k in hint)
                    keys = [k for k in keys if k not in hint]
                if keys:
                    placed.update(((m, k), v) for k, v in self._locate(plan, m, keys).items())
            w.insert(rows, [placed.get((r[1], r[2]), (None, None)) for r in rows])
        return new + len(rows) + len(gone)

    def commit_placed_columns(self, space: str, columns: Sequence[list]) -> int:
        """:meth:`commit_rows` (``skip_unchanged``) of rows that carry where their vectors were just
        stored in ``space``, given column by column: ids, modalities, keys, source JSON, metadata
        JSON and rows (an import's worker commits batches so). While that space is the current one,
        rows of new ids go in as given, without a lookup or a tuple each; the others (a repeated
        import) are compared with the live items by :meth:`commit_rows`, in a transaction of their
        own."""
        ids, modalities, keys, sources, metadata, rows = (c if type(c) is list else list(c) for c in columns)
        if len({len(ids), len(modalities), len(keys), len(sources), len(metadata), len(rows)}) > 1:
            raise ValueError("placed columns must be of one length")
        if not ids:
            return 0
        left, new = list(range(len(ids))), 0
        with self._writing() as w:
            plan = w.header["plan"]
            if space == plan.current and getattr(self.gallery(space, plan), "stable_positions", False):
                rids = w.insert_columns([ids, modalities, keys, sources, metadata, [space] * len(ids), rows],
                                        new_ids_only=True)
                left = [j for j, rid in enumerate(rids) if rid is None] if None in rids else []
                new = len(ids) - len(left)
            w.unchanged = not new  # nothing written: no new generation
        if left:
            new += self.commit_rows([(ids[j], modalities[j], keys[j], sources[j], metadata[j]) for j in left],
                                    stored=(space, {keys[j]: rows[j] for j in left}), skip_unchanged=True)
        return new

    def delete(self, ids: Iterable[str], *, missing_ok: bool = False) -> int:
        """Delete items by id; they are never returned again."""
        return self.commit(deletes=list(ids), missing_ok=missing_ok)

    def put_vectors(self, space_id: str, modality: str, keys: Sequence[str], vectors: np.ndarray) -> int:
        """Commit vectors of ``space_id`` for item versions ``keys`` (rows already present are
        skipped, so a retried batch never stores a vector twice); live items of those versions that
        a later space in serving order served move to this one. Returns how many rows were added."""
        g = self.gallery(space_id)
        added = g.add(modality, list(keys), vectors, [{} for _ in keys], space_id=space_id, skip_existing=True)
        self.serve_stored(space_id, modality, keys)
        return added

    def serve_stored(self, space_id: str, modality: str, keys: Sequence[str]) -> None:
        """Live items of versions ``keys`` that ``space_id``'s store holds and that a later space in
        serving order (or none) served are served by ``space_id`` from now on (the catalog half of
        :meth:`put_vectors`; alone, it finishes the commit of vectors stored by a process killed
        before its catalog transaction)."""
        if not keys:
            return
        with self._writing() as w:
            rows = [r for r in w.rows_by_key(list(keys)) if r.modality == modality]
            pref = w.header["plan"].serving_order()
            if space_id not in pref:
                return
            rank = {s: i for i, s in enumerate(pref)}
            move = [r for r in rows if r.space is None or rank.get(r.space, len(pref)) > rank[space_id]]
            if move:
                g = self.store_for_lookup(space_id)
                pos = g.positions(modality, [r.key for r in move])
                for r in move:
                    if r.key in pos:
                        w.serve(r.rid, modality, (r.space, r.pos), (space_id, _row_of(g, pos[r.key])))

    def add_space(self, *, space_id: str, dim: int, model: str, name: str = "",
                  modalities: Sequence[str] = MODALITIES) -> Space:
        """Create the (empty) store of a new space; the plan lists it once :meth:`set_plan`
        commits a plan naming it (:meth:`Plan.with_space`). Returns its plan entry."""
        mods = [m for m in MODALITIES if m in set(modalities)]
        entry = _space_entry(space_id, dim, model, name, mods, f"{SPACE_DIR}/{_space_dirname(space_id)}")
        self.storage.create_space(entry.dir, space_id=space_id, dim=int(dim), model=str(model),
                                  backend=self.backend)
        return entry

    def set_plan(self, update: Callable[[Plan], Plan]) -> Plan:
        """Atomically replace the plan by ``update(plan)``, the one way a plan changes. ``update``
        runs inside the write transaction on the latest plan, so it can refuse (raise) based on it.
        Where the serving order changes (a space retired, the current model changed back), every
        item affected is served again by the first space that holds it. Returns the committed plan."""
        with self._writing() as w:
            before = w.header["plan"]
            try:
                plan = update(before)
            except PlanError as e:
                raise PlanError(f"collection {self.path}: {e}") from None
            if not isinstance(plan, Plan):
                raise TypeError(f"a plan update must return a Plan, got {type(plan).__name__}")
            checked = {s.space_id for s in before.spaces if not s.retired}  # their stores were checked when added
            for s in plan.spaces:
                if not s.retired and s.space_id not in checked and not self.storage.has_space(s.dir):
                    raise ValueError(f"plan names space {s.space_id} but {self.storage} has no store "
                                     f"{s.dir} (call add_space first)")
            self._reserve(w, before, plan)
            w.set_plan(plan)
        return self.plan

    def _reserve(self, w: Writer, before: Plan, after: Plan) -> None:
        """Serve every item again by the serving order of ``after`` where it differs from ``before``."""
        old, new = before.serving_order(), after.serving_order()
        dropped = [s for s in old if s not in new]
        added = [s for s in new if s not in old]
        empty_added = all(not self.gallery(s, after).count(m) for s in added for m in MODALITIES)
        if [s for s in new if s not in added] == [s for s in old if s not in dropped] and empty_added and not dropped:
            return  # a new, empty space in front: nothing moves
        if [s for s in new if s not in added] == [s for s in old if s not in dropped] and empty_added:
            rows = [r for s in dropped for r in w.rows_served_by(s)]
        else:
            rows = w.all_rows()
        for s in dropped:
            w.drop_serving(s)
        for m in MODALITIES:
            mine = [r for r in rows if r.modality == m]
            where = self._locate(after, m, [r.key for r in mine]) if mine else {}
            for r in mine:
                target = where.get(r.key)
                if target != (r.space, r.pos):
                    w.serve(r.rid, m, (None, None) if r.space in dropped else (r.space, r.pos),
                            target if target is not None else (None, None))

    def rebuild_serving(self) -> int:
        """Work out again, from the stores, which row serves each item (after a store lost or
        renumbered rows: ``verify --repair``); returns how many items no space holds now."""
        with self._writing() as w:
            plan = w.header["plan"]
            for sid in plan.serving_order():
                w.drop_serving(sid)
            rows = w.all_rows()
            unserved = 0
            for m in MODALITIES:
                mine = [r for r in rows if r.modality == m]
                where = self._locate(plan, m, [r.key for r in mine]) if mine else {}
                for r in mine:
                    target = where.get(r.key, (None, None))
                    unserved += target[0] is None
                    w.serve(r.rid, m, (None, None), target)
        return unserved
