// nobackfill web page: text / image search, thumbnails, collection status with a live backfill bar.
const $ = (id) => document.getElementById(id);
const keyInput = $("key");
keyInput.value = localStorage.getItem("nobackfill-key") || "";
keyInput.addEventListener("change", () => { localStorage.setItem("nobackfill-key", keyInput.value.trim()); refresh(); });
const headers = () => ({ Authorization: "Bearer " + keyInput.value.trim() });
const thumbs = new Map();

function say(text, error = false) { const m = $("message"); m.textContent = text; m.className = error ? "error" : ""; }

async function api(path, options = {}) {
  const res = await fetch(path, { ...options, headers: { ...headers(), ...(options.headers || {}) } });
  const body = res.headers.get("content-type")?.includes("json") ? await res.json() : null;
  if (!res.ok) throw new Error(body?.detail || res.statusText);
  return body;
}

async function thumbnail(id) {
  if (thumbs.has(id)) return thumbs.get(id);
  const res = await fetch(`/v1/items/${encodeURIComponent(id)}/thumbnail?size=200`, { headers: headers() });
  const url = res.ok ? URL.createObjectURL(await res.blob()) : "";
  thumbs.set(id, url);
  return url;
}

function card(hit) {
  const el = document.createElement("div");
  el.className = "hit";
  el.dataset.id = hit.id;
  const route = `<span class="tag ${hit.route === "native" ? "native" : ""}">${hit.route}</span>`;
  const meta = `<div class="meta"><span>#${hit.rank} · ${hit.score.toFixed(3)}</span>${route}</div>`;
  if (hit.text !== undefined) {
    el.innerHTML = `<div class="caption"></div>${meta}`;
    el.querySelector(".caption").textContent = hit.text;
  } else {
    el.innerHTML = `<img alt="">${meta}`;
    thumbnail(hit.id).then((url) => { el.querySelector("img").src = url; });
  }
  el.title = `${hit.id}\nspace ${hit.space}\nroute ${hit.route}`;
  return el;
}

function show(result, label) {
  const grid = $("results");
  grid.replaceChildren(...result.hits.map(card));
  const spaces = new Set(result.hits.map((h) => h.space)).size;
  say(`${result.hits.length} ${result.modality}s for ${label} · answered by ${spaces} space${spaces === 1 ? "" : "s"}`);
}

$("text-form").addEventListener("submit", async (e) => {
  e.preventDefault();
  const text = $("query").value.trim();
  if (!text) return say("Type a query first.", true);
  say("Searching…");
  try {
    const body = { text, k: Number($("k").value) };
    if ($("target").value) body.target = $("target").value;
    show(await api("/v1/search", { method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify(body) }), `“${text}”`);
  } catch (err) { say(err.message, true); }
});

async function searchImage(file) {
  if (!file) return;
  say("Searching by image…");
  const form = new FormData();
  form.append("image", file);
  form.append("k", $("k").value);
  if ($("target").value) form.append("target", $("target").value);
  try { show(await api("/v1/search", { method: "POST", body: form }), `the image ${file.name}`); }
  catch (err) { say(err.message, true); }
}

const drop = $("drop");
drop.addEventListener("click", () => $("file").click());
$("file").addEventListener("change", (e) => searchImage(e.target.files[0]));
drop.addEventListener("dragover", (e) => { e.preventDefault(); drop.classList.add("over"); });
drop.addEventListener("dragleave", () => drop.classList.remove("over"));
drop.addEventListener("drop", (e) => { e.preventDefault(); drop.classList.remove("over"); searchImage(e.dataTransfer.files[0]); });

async function refresh() {
  if (!keyInput.value.trim()) { $("collection").textContent = "Enter an API key to see the collection."; return; }
  try {
    const st = await api("/v1/status");
    $("collection").innerHTML = `<b></b><br>${st.items.image} images · ${st.items.text} captions · merge ${st.merge}`;
    $("collection").querySelector("b").textContent = st.name;
    $("spaces").replaceChildren(...Object.entries(st.spaces).filter(([, s]) => !s.retired).map(([id, s]) => {
      const el = document.createElement("div");
      el.className = "space" + (s.current ? " current" : "");
      const route = st.routes[id] ? Object.entries(st.routes[id]).filter(([d]) => d === "t2i" || d === "i2t" || d === "t2t")
        .map(([d, r]) => `${d} ${r.route}`).join(", ") : "native";
      el.innerHTML = `<b></b> ${s.current ? '<span class="tag native">current</span>' : ""}<br>${s.image || 0} images · ${s.text || 0} captions<br>${route}<br><code></code>`;
      el.querySelector("b").textContent = s.name;
      el.querySelector("code").textContent = id;
      return el;
    }));
    const bf = st.backfill;
    $("bar-fill").style.width = `${(100 * bf.fraction).toFixed(1)}%`;
    const state = bf.state === "none" ? "no backfill started" : bf.state;
    $("backfill-text").textContent = `${bf.done} / ${bf.total} items (${(100 * bf.fraction).toFixed(1)}%) · ${state}` +
      (bf.rate ? ` · ${bf.rate.toFixed(0)} items/s` : "");
  } catch (err) { $("collection").textContent = err.message; }
}
refresh();
setInterval(refresh, 2000);
