// mixgraph's extension for the ComfyUI web editor (comfyui-frontend-package 1.58).
//
// * Precision regions (DESIGN §3): right-click a group -> "Precision (mixgraph)" -> a SPEC.
//   The SPEC goes into the group's title as a tag ("Sampling [bf16]"), which survives saving,
//   since the editor does not keep group properties; a `properties.precision` that came with
//   a loaded workflow is kept on save and is replaced when a tag is chosen here.
// * NaN fallback: when the server reports `mixgraph.nan_fallback` (a node under half precision
//   produced non-finite values and was re-run in f32), the node gets an orange badge and the
//   editor shows a toast. `mixgraph.warning` messages become toasts too.
//
// * The default graph: the editor's own default (a model family mixgraph does not run) is
//   replaced, in place, by the server's default template (`/templates/txt2img_shapes.json`:
//   txt2img on the embedded model), so a first start, "Load Default Workflow" and a new tab all
//   open on a graph that runs. A first start also skips the editor's first-run tutorial (a blank
//   canvas under the template browser) by marking it completed.
//
// window.mixgraph (also used by tests): {loaded, version, specs, precisionOf(group),
// setGroupPrecision(group, spec|null), nanFallbacks (node id -> event data)}.

import { app } from "../../scripts/app.js";
import { api } from "../../scripts/api.js";

// Presets first (auto = balanced; what each resolves to per model type on the server's device is
// in /system_stats: devices[0].mixgraph_precision.presets), then plain SPECs.
const SPECS = ["auto", "quality", "balanced", "memory", "fast", "f32", "bf16", "f16", "bf16:f32",
               "f16+upcast", "fp8_e4m3fn:bf16", "int8"];
// The tag graph/formats/ui_format.py recognises in a group title.
const TAG = /\[\s*((?:auto|quality|balanced|memory|fast|f32|fp32|bf16|f16|fp16|fp8_?\w*|int8)(?:[:+][\w.:+]*)?)\s*\]/i;
const nanFallbacks = new Map();
const DEFAULT_TEMPLATE = "txt2img_shapes";
let defaultGraph = null;

// Replace the editor's default graph object in place (the editor keeps a reference to it).
async function installDefaultGraph() {
  try {
    const url = api.fileURL ? api.fileURL(`/templates/${DEFAULT_TEMPLATE}.json`)
                            : `/templates/${DEFAULT_TEMPLATE}.json`;
    const res = await fetch(url);
    if (!res.ok) return;
    defaultGraph = await res.json();
    const holder = window.comfyAPI?.defaultGraph;
    const target = holder?.defaultGraph;
    if (target && typeof target === "object") {
      for (const key of Object.keys(target)) delete target[key];
      Object.assign(target, structuredClone(defaultGraph));
      holder.defaultGraphJSON = JSON.stringify(defaultGraph);
    }
  } catch (e) {
    console.warn("[mixgraph] default graph not installed:", e);
  }
}

await installDefaultGraph();

function precisionOf(group) {
  const fromProps = group?.properties?.precision;
  if (typeof fromProps === "string" && fromProps) return fromProps;
  const match = TAG.exec(group?.title ?? "");
  return match ? match[1] : null;
}

function setGroupPrecision(group, spec) {
  const base = (group.title ?? "").replace(TAG, "").replace(/\s+/g, " ").trim();
  group.title = spec ? `${base || "Group"} [${spec}]` : base || "Group";
  if (group.properties) delete group.properties.precision;
  group.graph?.change?.();
  app.canvas?.setDirty?.(true, true);
}

function toast(severity, summary, detail) {
  try {
    app.extensionManager?.toast?.add({ severity, summary, detail, life: 8000 });
  } catch (e) {
    console.warn("[mixgraph]", summary, detail);
  }
}

function findNode(id) {
  return app.graph?.getNodeById?.(Number.isNaN(Number(id)) ? id : Number(id)) ?? null;
}

// Draw the NaN-fallback badge above a node (chained onto its own drawing).
function markNode(node) {
  if (!node || node.__mixgraphBadge) return;
  node.__mixgraphBadge = true;
  const draw = node.onDrawForeground;
  node.onDrawForeground = function (ctx) {
    const result = draw?.apply(this, arguments);
    const info = nanFallbacks.get(String(this.id));
    if (info) {
      const text = `NaN → ${info.fallback || "f32"}`;
      ctx.save();
      ctx.font = "bold 11px sans-serif";
      const w = ctx.measureText(text).width + 10;
      const y = -(globalThis.LiteGraph?.NODE_TITLE_HEIGHT ?? 30) - 20;
      ctx.fillStyle = "#d9822b";
      ctx.beginPath();
      const x = this.size[0] - w;
      ctx.roundRect ? ctx.roundRect(x, y, w, 16, 4) : ctx.rect(x, y, w, 16);
      ctx.fill();
      ctx.fillStyle = "#fff";
      ctx.fillText(text, this.size[0] - w + 5, y + 12);
      ctx.restore();
    }
    return result;
  };
}

function onNanFallback(event) {
  const d = event.detail ?? {};
  nanFallbacks.set(String(d.node_id), d);
  const node = findNode(d.node_id);
  markNode(node);
  app.canvas?.setDirty?.(true, true);
  const name = node?.title ?? d.node_type ?? "node";
  toast("warn", `NaN fallback: ${name} #${d.node_id}`,
        d.message || `non-finite output under ${d.precision}; re-ran with ${d.fallback}`);
}

function precisionMenu(canvas) {
  const graph = canvas?.graph;
  const mouse = canvas?.graph_mouse;
  const group = graph && mouse ? graph.getGroupOnPos?.(mouse[0], mouse[1]) : null;
  if (!group) return [];
  const current = precisionOf(group);
  const options = SPECS.map((spec) => ({
    content: spec === current ? `✓ ${spec}` : spec,
    callback: () => setGroupPrecision(group, spec),
  }));
  options.push(null, { content: "none (inherit)", disabled: !current,
                       callback: () => setGroupPrecision(group, null) });
  return [null, { content: `Precision (mixgraph)${current ? `: ${current}` : ""}`,
                  has_submenu: true, submenu: { title: "Precision", options } }];
}

// Keep `properties` (precision) of groups loaded from a workflow file through the editor.
function keepGroupProperties() {
  const Group = globalThis.LiteGraph?.LGraphGroup;
  if (!Group || Group.prototype.__mixgraphProps) return;
  Group.prototype.__mixgraphProps = true;
  const configure = Group.prototype.configure;
  Group.prototype.configure = function (o) {
    configure.call(this, o);
    if (o?.properties && typeof o.properties === "object") this.properties = { ...o.properties };
  };
  const serialize = Group.prototype.serialize;
  Group.prototype.serialize = function () {
    const o = serialize.call(this);
    if (this.properties && Object.keys(this.properties).length) {
      o.properties = { ...this.properties };
    }
    return o;
  };
}

app.registerExtension({
  name: "mixgraph.Precision",
  init() {
    keepGroupProperties();
  },
  async setup() {
    const settings = app.extensionManager?.setting;
    if (settings && !settings.get("Comfy.TutorialCompleted")) {
      await settings.set("Comfy.TutorialCompleted", true);
    }
    api.addEventListener("mixgraph.nan_fallback", onNanFallback);
    api.addEventListener("mixgraph.warning", (e) =>
      toast("warn", "mixgraph", e.detail?.message ?? ""));
    api.addEventListener("execution_start", () => {
      nanFallbacks.clear();
      app.canvas?.setDirty?.(true, true);
    });
  },
  getCanvasMenuItems(canvas) {
    return precisionMenu(canvas);
  },
});

window.mixgraph = { loaded: true, version: 1, specs: SPECS, precisionOf, setGroupPrecision,
                    nanFallbacks, defaultTemplate: DEFAULT_TEMPLATE,
                    get defaultGraph() { return defaultGraph; } };
