// One streaming request through the real Node consumer; prints what it delivered.
//
// Usage:
//   node node_client.mjs --client node-openai|pi --api openai-chat|anthropic-messages \
//        --base-url URL [--model M] [--case NAME] [--node-dir DIR]
//   node node_client.mjs --client ... --batch < requests.jsonl   (one {"case","api","base_url","model"} per line)
//
// Output: JSON Lines like compat/py_client.py: {"kind":"event"} per delivered chunk or event,
// then {"kind":"error"} or {"kind":"end"}. Exits 0 whatever the consumer did.
//
// The packages live outside the source tree (compat/install.sh puts them in
// target/compat/node), so they are imported by path.
import { readFileSync } from "node:fs";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath, pathToFileURL } from "node:url";

function parseArgs(argv) {
  const out = { model: "gpt-4o-mini", case: "", batch: false };
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i];
    if (a === "--batch") out.batch = true;
    else if (a.startsWith("--")) out[a.slice(2).replace(/-(.)/g, (_, c) => c.toUpperCase())] = argv[++i];
  }
  return out;
}

const args = parseArgs(process.argv.slice(2));
const here = dirname(fileURLToPath(import.meta.url));
const nodeDir = resolve(args.nodeDir ?? process.env.DOCSFAB_COMPAT_NODE_DIR ?? join(here, "..", "target", "compat", "node"));
const load = (rel) => import(pathToFileURL(join(nodeDir, "node_modules", rel)).href);

const emit = (record) => process.stdout.write(JSON.stringify(record) + "\n");

let openaiMod;
let piMod;

async function nodeOpenai(req, base) {
  if (req.api !== "openai-chat") throw new Error(`node-openai speaks openai-chat only, not ${req.api}`);
  openaiMod ??= await load("openai/index.mjs");
  const client = new openaiMod.default({ baseURL: req.base_url, apiKey: "sk-compat-test", maxRetries: 0, timeout: 20000 });
  const stream = await client.chat.completions.create({
    model: req.model,
    messages: [{ role: "user", content: "hi" }],
    stream: true,
  });
  for await (const chunk of stream) emit({ ...base, kind: "event", event: chunk });
  emit({ ...base, kind: "end" });
}

// pi-ai never throws from its stream: a failure arrives as an "error" event. Its events carry the
// whole partial message each time; only the parts that come from the wire are kept.
function piEvent(ev) {
  const out = { type: ev.type };
  for (const k of ["contentIndex", "delta", "content", "reason"]) if (ev[k] !== undefined) out[k] = ev[k];
  const msg = ev.type === "done" ? ev.message : ev.type === "error" ? ev.error : undefined;
  if (msg) {
    out.message = {
      stopReason: msg.stopReason,
      errorMessage: msg.errorMessage,
      responseId: msg.responseId,
      responseModel: msg.responseModel,
      content: msg.content,
      usage: msg.usage && { input: msg.usage.input, output: msg.usage.output },
    };
  }
  return out;
}

async function pi(req, base) {
  piMod ??= await load("@mariozechner/pi-ai/dist/index.js");
  const api = req.api === "openai-chat" ? "openai-completions" : req.api === "anthropic-messages" ? "anthropic-messages" : null;
  if (!api) throw new Error(`unknown api ${req.api}`);
  const model = {
    id: req.model,
    name: req.model,
    api,
    provider: "docsfab-compat",
    baseUrl: req.base_url,
    reasoning: false,
    input: ["text"],
    cost: { input: 0, output: 0, cacheRead: 0, cacheWrite: 0 },
    contextWindow: 128000,
    maxTokens: 64,
  };
  const context = { messages: [{ role: "user", content: "hi", timestamp: Date.now() }] };
  const s = piMod.stream(model, context, { apiKey: "compat-test", maxRetries: 0, timeoutMs: 20000 });
  let failed = false;
  for await (const ev of s) {
    emit({ ...base, kind: "event", event: piEvent(ev) });
    if (ev.type === "error") failed = true;
  }
  if (failed) {
    // Report the failure the way the other clients do, so the harness can treat it alike.
    const res = await s.result();
    emit({ ...base, kind: "error", error_type: "pi-error-event", message: String(res.errorMessage ?? "").slice(0, 500) });
  } else {
    emit({ ...base, kind: "end" });
  }
}

async function runOne(req) {
  const client = args.client;
  const base = { case: req.case, client: client === "pi" ? `pi-${req.api}` : client };
  try {
    if (client === "node-openai") await nodeOpenai(req, base);
    else if (client === "pi") await pi(req, base);
    else throw new Error(`unknown --client ${client}`);
  } catch (err) {
    emit({ ...base, kind: "error", error_type: err?.constructor?.name ?? "Error", message: String(err?.message ?? err).slice(0, 500) });
  }
}

if (args.batch) {
  const lines = readFileSync(0, "utf8").split("\n").filter((l) => l.trim());
  for (const l of lines) await runOne(JSON.parse(l));
} else {
  if (!args.api || !args.baseUrl) {
    console.error("--api and --base-url are required without --batch");
    process.exit(2);
  }
  await runOne({ case: args.case, api: args.api, base_url: args.baseUrl, model: args.model });
}
