// The translation page: calls POST /v1/translate and draws each sentence's translations,
// scores and cross-attention heatmap (rows: target pieces, columns: source pieces). The
// From/To pickers offer the selected model's languages (GET /v1/models: source -> its
// targets), named as GET /languages names them.
"use strict";

const $ = (id) => document.getElementById(id);
let models = [];
let languageNames = {};

function setStatus(text, isError) {
  const status = $("status");
  status.textContent = text;
  status.className = isError ? "error" : "";
}

function element(tag, attrs, ...children) {
  const node = document.createElement(tag);
  Object.entries(attrs || {}).forEach(([key, value]) => node.setAttribute(key, value));
  children.forEach((child) => node.append(child));
  return node;
}

async function loadModels() {
  try {
    const [response, languages] = await Promise.all([fetch("v1/models"), fetch("languages")]);
    const body = await response.json();
    if (!response.ok) throw new Error(body.error || response.statusText);
    if (languages.ok) {
      languageNames = Object.fromEntries((await languages.json()).map((l) => [l.code, l.name]));
    }
    models = body.models;
    $("model").replaceChildren(...models.map((m) => element("option", { value: m.name }, modelLabel(m))));
    $("key-label").hidden = !body.api_key_required;
    updateModel();
  } catch (error) {
    setStatus(`The models are not ready (${error.message}); reload the page in a moment.`, true);
  }
}

function selectedModel() {
  return models.find((m) => m.name === $("model").value);
}

function modelLabel(model) {
  if (model.source) return `${model.name} (${model.source} → ${model.target})`;
  const langs = new Set(Object.entries(model.languages).flatMap(([src, tgts]) => [src, ...tgts]));
  return `${model.name} (${[...langs].join(", ")})`;
}

function languageOption(code) {
  const name = languageNames[code];
  return element("option", { value: code }, name && name !== code ? `${name} (${code})` : code);
}

// The source languages of the model (or "any": the tag names the target), then the targets
// from the one chosen, keeping the choices the new lists still offer.
function updateModel() {
  const model = selectedModel();
  if (!model) return;
  $("nbest").max = model.search.beam;
  const from = $("src-lang");
  const chosen = from.value;
  const sources = Object.keys(model.languages);
  const any = element("option", { value: "" }, "any");
  from.replaceChildren(...(sources.length > 1 ? [any] : []), ...sources.map(languageOption));
  if (sources.includes(chosen)) from.value = chosen;
  updateTargets();
}

function updateTargets() {
  const model = selectedModel();
  if (!model) return;
  const to = $("tgt-lang");
  const chosen = to.value;
  const source = $("src-lang").value;
  const targets = source
    ? model.languages[source]
    : [...new Set(Object.values(model.languages).flat())];
  to.replaceChildren(...targets.map(languageOption));
  if (targets.includes(chosen)) to.value = chosen;
}

function heatmap(attention) {
  const head = element("tr", {}, element("th"));
  attention.source.forEach((piece) => head.append(element("th", { scope: "col" }, piece)));
  const body = element("tbody");
  attention.weights.forEach((row, t) => {
    const tr = element("tr", {}, element("th", { scope: "row" }, attention.target[t]));
    row.forEach((weight, s) => {
      const cell = element("td", {
        title: `${attention.target[t]} → ${attention.source[s]}: ${weight.toFixed(3)}`,
      });
      cell.style.background = `rgba(37, 99, 235, ${Math.min(1, weight).toFixed(3)})`;
      tr.append(cell);
    });
    body.append(tr);
  });
  return element("div", { class: "heatmap-box" },
    element("table", { class: "heatmap", "aria-label": "cross-attention" }, element("thead", {}, head), body));
}

function showResults(lines, results, withScores) {
  const box = $("results");
  box.replaceChildren();
  results.forEach((result, i) => {
    if (!lines[i].trim()) return;
    const list = element("ol");
    result.translations.forEach((t, rank) => {
      const item = element("li", { class: rank === 0 ? "best translation" : "translation" }, t.text);
      if (withScores && t.score !== undefined) item.append(element("span", { class: "score" }, t.score.toFixed(3)));
      list.append(item);
    });
    const div = element("div", { class: "result" }, element("p", { class: "source" }, lines[i]), list);
    if (result.attention && result.attention.weights.length) div.append(heatmap(result.attention));
    box.append(div);
  });
}

async function translate() {
  const lines = $("source").value.split("\n");
  if (!lines.some((line) => line.trim())) {
    setStatus("Type a sentence first.", true);
    return;
  }
  const withScores = $("scores").checked;
  const request = {
    model: $("model").value || null,
    src_lang: $("src-lang").value || null,
    tgt_lang: $("tgt-lang").value || null,
    texts: lines,
    nbest: Number($("nbest").value) || 1,
    return_scores: withScores,
    return_attention: $("heatmap").checked,
  };
  const headers = { "Content-Type": "application/json" };
  const key = $("api-key").value;
  if (key) headers.Authorization = `Bearer ${key}`;
  setStatus("Translating…");
  $("translate").disabled = true;
  const start = performance.now();
  try {
    const response = await fetch("v1/translate", { method: "POST", headers, body: JSON.stringify(request) });
    const body = await response.json();
    if (!response.ok) throw new Error(body.error || response.statusText);
    showResults(lines, body.results, withScores);
    const note = body.warnings.length ? ` ${body.warnings.join(" ")}` : "";
    setStatus(`Translated by ${body.model} in ${Math.round(performance.now() - start)} ms.${note}`);
  } catch (error) {
    setStatus(error.message, true);
  } finally {
    $("translate").disabled = false;
  }
}

$("translate").addEventListener("click", translate);
$("model").addEventListener("change", updateModel);
$("src-lang").addEventListener("change", updateTargets);
$("source").addEventListener("keydown", (event) => {
  if (event.key === "Enter" && (event.ctrlKey || event.metaKey)) translate();
});
loadModels();
