// The console's script: a file of its own, since the page's Content-Security-Policy (default-src 'self')
// runs no inline script.
"use strict";
const $ = (id) => document.getElementById(id);
const selected = new Set();  // dead letters ticked for replay, kept across refreshes

function fmtTime(ms) { return ms == null ? "-" : new Date(ms).toISOString().replace("T", " ").replace(/\.\d+Z$/, "Z"); }
function fmtAhead(ms, now) {
  if (ms == null) return "-";
  const s = Math.round((ms - now) / 1000);
  return fmtTime(ms) + (s >= 0 ? " (in " + s + "s)" : " (" + (-s) + "s ago)");
}
function cell(tr, text, cls) { const td = document.createElement("td"); td.textContent = text == null ? "-" : String(text); if (cls) td.className = cls; tr.appendChild(td); return td; }
function fill(tableId, rows, build) {
  const body = $(tableId).querySelector("tbody");
  body.replaceChildren();
  for (const row of rows) { const tr = document.createElement("tr"); build(tr, row); body.appendChild(tr); }
}
function headers() {
  const h = {"Content-Type": "application/json"};
  if ($("token").value) h["Authorization"] = "Bearer " + $("token").value;
  return h;
}

function render(d) {
  $("worker").textContent = d.worker; $("at").textContent = fmtTime(d.at); $("window").textContent = d.window;
  $("at").dataset.at = d.at;
  $("logout").hidden = !d.read_protected;
  $("write-api").textContent = d.write_api ? "" : "(the write API is off on this worker: DELAYAPP_API_TOKEN)";
  const alerts = $("alerts"); alerts.replaceChildren();
  for (const a of d.alerts) { const div = document.createElement("div"); div.className = "alert " + a.level; div.textContent = a.level.toUpperCase() + ": " + a.text; alerts.appendChild(div); }
  if (!d.alerts.length) { const div = document.createElement("div"); div.className = "ok"; div.textContent = "nothing to act on"; alerts.appendChild(div); }

  $("waiting-due").innerHTML = d.waiting.by_due_svg;  // SVG drawn and escaped by the server
  $("waiting-known").textContent = d.waiting.known + " records waiting in the read model" + (d.waiting.truncated ? " (some workers did not answer: their share is missing)" : "");
  $("waiting-topic").innerHTML = d.waiting.by_topic_svg;
  fill("pending-table", d.waiting.by_topic, (tr, r) => { cell(tr, r.loop); cell(tr, r.topic); const td = cell(tr, r.pending, "num"); td.dataset.topic = r.topic; });

  $("per-second").textContent = d.delivery.per_second;
  $("delivered-total").textContent = d.delivery.delivered_total;
  const early = $("early"); early.textContent = d.delivery.early; early.className = "big " + (d.delivery.early ? "bad" : "ok");
  fill("lateness-loops", Object.entries(d.delivery.by_loop), (tr, [name, l]) => {
    tr.dataset.loop = name; cell(tr, name); cell(tr, l.count, "num"); cell(tr, l.p50, "num"); cell(tr, l.p99, "num"); cell(tr, l.max, "num"); cell(tr, l.per_second, "num");
  });
  fill("lateness-targets", Object.entries(d.delivery.by_target), (tr, [target, l]) => {
    if (l.early) tr.className = "hot";
    cell(tr, target); cell(tr, l.count, "num"); cell(tr, l.p50, "num"); cell(tr, l.p99, "num"); cell(tr, l.max, "num"); cell(tr, l.early, "num"); cell(tr, l.per_second, "num");
  });

  $("dlq-series").innerHTML = d.dead_letters.series_svg;
  fill("dlq-reasons", Object.entries(d.dead_letters.by_reason), (tr, [reason, n]) => { tr.dataset.reason = reason; cell(tr, reason); cell(tr, n, "num"); });
  $("dlq-read").textContent = d.dead_letters.ready ? d.dead_letters.read + " dead letters read" : "reading the dead-letter topic...";
  fill("dlq-latest", d.dead_letters.latest, (tr, x) => {
    tr.dataset.key = x.key;
    const td = document.createElement("td"); const box = document.createElement("input"); box.type = "checkbox"; box.value = x.key;
    box.checked = selected.has(x.key); box.disabled = !!x.replayed || !x.replayable;
    box.addEventListener("change", () => box.checked ? selected.add(x.key) : selected.delete(x.key));
    td.appendChild(box); tr.appendChild(td);
    cell(tr, x.key); cell(tr, fmtTime(x.at)); cell(tr, x.reason); cell(tr, x.target); cell(tr, x.record_id); cell(tr, x.detail);
    cell(tr, x.replayed ? "yes, by " + (x.replayed.by || "?") + " to " + (x.replayed.to || "?") : (x.replayable ? "no" : "cannot: value dropped"), "replayed");
  });

  fill("loops", Object.entries(d.loops), (tr, [name, lp]) => {
    const t = lp.totals || {};
    if (!lp.running || t.restarts || t.stalls || t.fenced || t.skipped_by_retention) tr.className = "hot";
    tr.dataset.loop = name;
    cell(tr, name); cell(tr, lp.running ? "yes" : "NO"); cell(tr, fmtAhead(lp.oldest_due_at, d.at)); cell(tr, lp.partitions_waiting, "num");
    cell(tr, t.rebalances, "num"); cell(tr, t.restarts, "num"); cell(tr, t.stalls, "num"); cell(tr, t.fenced, "num"); cell(tr, t.consumed, "num"); cell(tr, t.dead_lettered, "num");
  });
  const far = $("far-heads"); far.replaceChildren();
  for (const f of d.far_heads) {
    const div = document.createElement("div"); div.className = "alert critical";
    div.textContent = f.topic + "/" + f.partition + " (" + f.loop + ") waits on a head due " + fmtTime(f.awake_at) + ", in " + f.ahead + ": beyond its " + f.limit;
    far.appendChild(div);
  }
}

async function refresh() {
  try {
    const response = await fetch("/console/data", {cache: "no-store"});
    // the session ended (token changed, cookie expired): back to the login form
    if (response.status === 401) { location.assign("/login?next=/console"); return; }
    const d = await response.json();
    if (!response.ok) { $("status").textContent = d.error || ("HTTP " + response.status); return; }
    render(d);
    $("status").textContent = "live"; $("status").dataset.refreshed = String(Date.now());
  } catch (e) { $("status").textContent = "worker not reachable: " + e; }
}

async function lookup() {
  const id = $("lookup-id").value.trim(); if (!id) return;
  const response = await fetch("/delay/records/" + encodeURIComponent(id), {cache: "no-store"});
  const s = await response.json();
  const out = $("lookup-result"); out.className = "";
  if (!response.ok) { out.textContent = s.error || ("HTTP " + response.status); out.dataset.status = "unknown"; return; }
  out.dataset.status = s.status;
  const lines = [
    ["record", s.record_id], ["status", s.status], ["target", s.target], ["retries", s.retries], ["replays", s.replays], ["hops taken", s.hops],
    ["where", s.topic == null ? null : s.offset == null ? s.topic : s.topic + "/" + s.partition + "/" + s.offset], ["entered", fmtTime(s.delayed_at)],
    ["next awake", fmtTime(s.next_awake_at)], ["due", fmtTime(s.due_at)], ["lateness", s.lateness_ms == null ? null : s.lateness_ms + " ms"],
    ["reason", s.reason], ["cancelled", s.cancel ? fmtTime(s.cancel.cancelled_at) + " by " + s.cancel.by + ": " + (s.cancel.reason || "-") : null],
    ["last step", fmtTime(s.at) + " (step " + s.seq + ")"],
  ];
  out.textContent = lines.map(([k, v]) => k.padEnd(11) + " " + (v == null ? "-" : v)).join("\n");
}

async function cancelRecord() {
  const id = $("cancel-id").value.trim(); if (!id) return;
  const response = await fetch("/delay/records/" + encodeURIComponent(id) + "/cancel", {method: "POST", headers: headers(), body: JSON.stringify({reason: $("cancel-reason").value})});
  const r = await response.json();
  $("cancel-result").textContent = response.ok ? "cancel written for " + r.record_id + " at " + fmtTime(r.cancelled_at) : "refused (HTTP " + response.status + "): " + r.error;
  $("cancel-result").dataset.outcome = response.ok ? "ok" : "refused";
}

async function replay() {
  const keys = [...selected]; if (!keys.length) { $("replay-result").textContent = "tick dead letters first"; return; }
  $("replay-result").textContent = "replaying " + keys.length + "...";
  const body = {keys}; if ($("replay-delay").value.trim()) body.delay = $("replay-delay").value.trim();
  const response = await fetch("/delay/dead-letters/replay", {method: "POST", headers: headers(), body: JSON.stringify(body)});
  const r = await response.json();
  const out = $("replay-result");
  if (!response.ok) { out.textContent = "refused (HTTP " + response.status + "): " + r.error; out.dataset.outcome = "refused"; return; }
  out.textContent = "replayed " + r.replayed.length + ", already replayed " + r.already_replayed + ", unreplayable " + r.unreplayable.length
    + r.unreplayable.map((u) => " [" + u.key + ": " + u.why + "]").join("");
  out.dataset.outcome = "ok";
  selected.clear();
  refresh();
}

$("token").value = sessionStorage.getItem("delayapp-token") || "";
$("token").addEventListener("change", () => sessionStorage.setItem("delayapp-token", $("token").value));
$("lookup-go").addEventListener("click", lookup);
$("lookup-id").addEventListener("keydown", (e) => { if (e.key === "Enter") lookup(); });
$("cancel-go").addEventListener("click", cancelRecord);
$("replay-go").addEventListener("click", replay);
refresh();
setInterval(refresh, 2000);
