// nobackfill web page: text / image search, thumbnails, collection status with a live backfill bar.
// Every action (a text search, an image search, a key change) starts from a clean slate: the reply to
// an older action is dropped, results that no longer answer the page's question go, and an error
// stays only until the next action succeeds.
const $ = (id) => document.getElementById(id);
const keyInput = $("key");
// the key lives as long as this tab (sessionStorage), never in the browser's profile
localStorage.removeItem("nobackfill-key"); // (where an earlier page kept it)
keyInput.value = sessionStorage.getItem("nobackfill-key") || "";
const key = () => keyInput.value.trim();
const headers = () => ({ Authorization: "Bearer " + key() });
let thumbs = new Map(); // item id -> promise of an object URL, fetched with the current key
let action = 0; // the latest search: replies to older ones are dropped
let statusCall = 0; // the latest status request: likewise

class ApiError extends Error {
  constructor(message, status) { super(message); this.status = status; }
}

async function api(path, options = {}) {
  const res = await fetch(path, { ...options, headers: { ...headers(), ...(options.headers || {}) } });
  const json = res.headers.get("content-type")?.includes("json");
  const body = json ? await res.json().catch(() => null) : null;
  if (!res.ok) throw new ApiError(body?.detail || `${res.status} ${res.statusText}`, res.status);
  return body;
}

function explain(err) {
  if (err instanceof ApiError && err.status === 401) return "the API key was refused: enter a read or admin key above.";
  if (err instanceof ApiError) return err.message;
  if (err instanceof TypeError) return `the server did not answer (${err.message}).`;
  return err.message;
}

function say(text, state = "") { const m = $("message"); m.textContent = text; m.className = state; }
function note(text, state = "") { const n = $("key-note"); n.textContent = text; n.className = state; }

function clearResults() {
  const grid = $("results");
  grid.replaceChildren();
  grid.classList.remove("stale");
  grid.removeAttribute("aria-busy");
}

// ------------------------------------------------------------------ results
function thumbnail(id) {
  if (!thumbs.has(id)) {
    const cache = thumbs;
    const url = fetch(`/v1/items/${encodeURIComponent(id)}/thumbnail?size=200`, { headers: headers() })
      .then(async (res) => {
        if (!res.ok) throw new Error((await res.json().catch(() => null))?.detail || res.statusText);
        return URL.createObjectURL(await res.blob());
      });
    url.catch(() => cache.delete(id)); // not remembered: the next search tries again
    cache.set(id, url);
  }
  return thumbs.get(id);
}

const NAMES = { image: "images", text: "captions" };

function card(hit, modality) { // modality: the result's (every hit of a search is of it)
  const el = document.createElement("div");
  el.className = "hit";
  el.dataset.id = hit.id;
  el.tabIndex = 0;
  const route = `<span class="tag ${hit.route === "native" ? "native" : ""}"></span>`;
  const meta = `<div class="meta"><span>#${hit.rank} · ${hit.score.toFixed(3)}</span>${route}</div>`;
  if (modality === "text") { // (an image's metadata may hold a "text" key too: still an image)
    el.innerHTML = `<div class="caption"></div>${meta}`;
    el.querySelector(".caption").textContent = (hit.metadata || {}).text ?? ""; // the item's metadata, whole
  } else {
    el.innerHTML = `<img alt=""><div class="unreadable">image not readable here</div>${meta}`;
    thumbnail(hit.id).then((url) => { el.querySelector("img").src = url; }, (err) => {
      el.classList.add("missing");
      el.querySelector(".unreadable").title = err.message; // the server's reason
    });
  }
  el.querySelector(".tag").textContent = hit.route;
  const details = document.createElement("div");
  details.className = "details"; // shown on a click or a tap (a title alone needs a mouse)
  details.textContent = `id ${hit.id} · space ${hit.space} · route ${hit.route}`;
  el.append(details);
  el.title = `${hit.id}\nspace ${hit.space}\nroute ${hit.route}`;
  const toggle = () => el.classList.toggle("open");
  el.addEventListener("click", toggle);
  el.addEventListener("keydown", (e) => { if (e.key === "Enter" || e.key === " ") { e.preventDefault(); toggle(); } });
  return el;
}

function asked(text, file) { // what the results answer: the text, or the image (shown)
  const img = $("asked-image");
  if (img.src) URL.revokeObjectURL(img.src);
  img.removeAttribute("src");
  $("asked").className = file ? "image" : "";
  if (file) img.src = URL.createObjectURL(file);
  $("asked-text").textContent = file ? `the query: ${file.name}` : "";
  if (file) $("query").value = ""; // the text box no longer says what the results answer
}

function begin(text) {
  const n = ++action;
  say(text, "busy");
  const grid = $("results");
  if (grid.children.length) { grid.classList.add("stale"); grid.setAttribute("aria-busy", "true"); }
  return n;
}

function show(n, result, label) {
  if (n !== action) return;
  clearResults();
  $("results").replaceChildren(...result.hits.map((hit) => card(hit, result.modality)));
  const spaces = new Set(result.hits.map((h) => h.space)).size;
  const what = NAMES[result.modality] || result.modality + "s";
  if (!result.hits.length) return say(`No ${what} for ${label}.`);
  say(`${result.hits.length} ${what} for ${label} · answered by ${spaces} space${spaces === 1 ? "" : "s"}` +
      (spaces > 1 ? " · merged: each score is on its own space's scale, so the order is the merge's, not the scores'" : ""));
}

function fail(n, err, what = "") {
  if (n !== action) return;
  clearResults(); // the old results answer another question
  const why = explain(err);
  say(what ? `${what}: ${why}` : why.charAt(0).toUpperCase() + why.slice(1), "error");
}

$("text-form").addEventListener("submit", async (e) => {
  e.preventDefault();
  const text = $("query").value.trim();
  const n = begin("Searching…");
  asked(text, null);
  if (!text) return fail(n, new Error("type a query first."));
  if (!key()) return fail(n, new Error("enter an API key first (top right)."));
  try {
    const body = { text, k: Number($("k").value) };
    if ($("target").value) body.target = $("target").value;
    const result = await api("/v1/search", { method: "POST", headers: { "Content-Type": "application/json" },
                                             body: JSON.stringify(body) });
    show(n, result, `“${text}”`);
  } catch (err) { fail(n, err, "Search failed"); }
});

async function searchImage(file) {
  if (!file) return;
  const n = begin(`Searching by the image ${file.name}…`);
  asked("", file);
  if (!key()) return fail(n, new Error("enter an API key first (top right)."));
  const form = new FormData();
  form.append("image", file);
  form.append("k", $("k").value);
  if ($("target").value) form.append("target", $("target").value);
  try { show(n, await api("/v1/search", { method: "POST", body: form }), `the image ${file.name}`); }
  catch (err) { fail(n, err, `Search by the image ${file.name} failed`); }
}

const drop = $("drop");
drop.addEventListener("click", () => $("file").click());
drop.addEventListener("keydown", (e) => { if (e.key === "Enter" || e.key === " ") { e.preventDefault(); $("file").click(); } });
$("file").addEventListener("change", (e) => {
  const file = e.target.files[0];
  e.target.value = ""; // choosing the same file again is a new search
  searchImage(file);
});
drop.addEventListener("dragover", (e) => { e.preventDefault(); drop.classList.add("over"); });
drop.addEventListener("dragleave", () => drop.classList.remove("over"));
drop.addEventListener("drop", (e) => { e.preventDefault(); drop.classList.remove("over"); searchImage(e.dataTransfer.files[0]); });

// ------------------------------------------------------------------ the key
keyInput.addEventListener("change", () => {
  sessionStorage.setItem("nobackfill-key", key());
  action++; // a search in flight asked with the old key
  clearResults();
  say("");
  for (const url of thumbs.values()) url.then(URL.revokeObjectURL, () => {});
  thumbs = new Map();
  refresh();
});

// ------------------------------------------------------------------ the collection panel
const DIRECTIONS = ["t2i", "i2t", "t2t", "i2i"]; // every search the page makes (i2i: an image, target images)
function clearStatus(text, error = false) {
  const c = $("collection");
  c.textContent = text;
  c.className = error ? "error" : "";
  $("spaces").replaceChildren();
  $("bar-fill").style.width = "0";
  $("backfill-text").textContent = "-";
  $("backfill-text").className = "";
}

async function refresh() {
  const n = ++statusCall;
  if (!key()) {
    note("needed to search", "hint");
    clearStatus("Enter an API key to see the collection.");
    return;
  }
  try {
    const st = await api("/v1/status");
    if (n !== statusCall) return;
    note("");
    const c = $("collection");
    c.className = "";
    const basis = st.calibrated ? " (on labels)" : st.merge_without_labels ? " (fitted without labels)" : "";
    c.innerHTML = `<b></b><br>${st.items.image} images · ${st.items.text} captions<br><span class="sub">merge ${st.merge}${basis}</span>`;
    c.querySelector("b").textContent = st.name;
    $("spaces").replaceChildren(...Object.entries(st.spaces).filter(([, s]) => !s.retired).map(([id, s]) => {
      const el = document.createElement("div");
      const empty = !s.current && !(s.image || 0) && !(s.text || 0);
      el.className = "space" + (s.current ? " current" : "") + (empty ? " empty" : "");
      const fitted = Object.fromEntries(((st.fitted_bridges || {}).serving || []).filter((b) => b.space === id)
        .map((b) => [b.direction, b]));
      const how = (b) => (b.family === "ensemble" && b.candidate ? `mean of ${b.candidate}` : b.family);
      const routes = st.routes[id] ? Object.entries(st.routes[id]).filter(([d]) => DIRECTIONS.includes(d)) : [];
      const route = empty ? "serves nothing now: every item is in a newer space (retire it to drop its vectors)"
        : routes.length ? routes.map(([d, r]) => `${d} ${r.route}` + (fitted[d] && r.route !== "old-model"
          ? ` (fitted, ${fitted[d].pairs} pairs)` : "")).join(", ") : "native";
      el.title = routes.map(([d, r]) => `${d} ${r.route}` + (fitted[d] ? ` (bridge fitted: ${how(fitted[d])}, ` +
        `${fitted[d].pairs} pairs)` : "")).join("\n");  // the whole story on hover
      el.innerHTML = `<b></b> ${s.current ? '<span class="tag native">current</span>' : ""}<br>${s.image || 0} images · ${s.text || 0} captions<br><span class="routes"></span><br><code></code>`;
      el.querySelector("b").textContent = s.name;
      el.querySelector(".routes").textContent = route;  // text, never markup: the names come from the catalog
      el.querySelector("code").textContent = id;
      return el;
    }));
    const bf = st.backfill;
    $("bar-fill").style.width = `${(100 * bf.fraction).toFixed(1)}%`;
    const state = bf.state === "none" ? "no backfill running" : bf.state;
    const text = $("backfill-text");
    const percent = bf.done < bf.total ? Math.min(99.9, Math.floor(1000 * bf.fraction) / 10) : 100 * bf.fraction;
    text.textContent = `${bf.done} / ${bf.total} items (${percent.toFixed(1)}%) · ${state}` +
      (bf.rate ? ` · ${bf.rate.toFixed(0)} items/s` : "") +
      (bf.unreadable ? ` · ${bf.unreadable} unreadable, left in the old space: ${Object.keys(bf.unreadable_items || {}).join(", ")}` : "") +
      (bf.error ? ` · worker failed: ${bf.error}` : "");
    text.className = bf.error ? "error" : bf.unreadable ? "warn" : "";
  } catch (err) {
    if (n !== statusCall) return;
    if (err instanceof ApiError && err.status === 401) {
      note("key refused", "error");
      clearStatus("The API key was refused: enter a read or admin key.", true);
    } else {
      note("");
      clearStatus(`No status: ${explain(err)}`, true);
    }
  }
}
refresh();
setInterval(refresh, 2000);
