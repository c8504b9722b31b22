#!/usr/bin/env node
// Cross-checks the chat template goldens (tests/fixtures/chat_templates/golden.jsonl, rendered by
// tools/oracle/chat_template_golden.py with Python's jinja2 as transformers runs it) with @huggingface/jinja,
// transformers.js's Jinja, under Node.js: every case is rendered again here and each difference is listed.
// Python is the truth where the two differ (docs/MODELS.md lists the known differences); --write-node FILE
// writes this renderer's own JSON lines for inspection.
//
// Usage: scripts/fetch-node-tools.sh && node tools/oracle/chat_template_golden.mjs [--verbose] [--write-node FILE]
import { readFileSync, writeFileSync } from "node:fs";
import { createRequire } from "node:module";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

process.env.TZ = "UTC"; // strftime_now reads the fixed clock below as the goldens do: 2024-07-26 12:00:00
const FIXED_NOW = Date.UTC(2024, 6, 26, 12, 0, 0);
const RealDate = Date;
globalThis.Date = class extends RealDate {
  constructor(...args) {
    super(...(args.length ? args : [FIXED_NOW]));
  }
  static now() {
    return FIXED_NOW;
  }
};

const root = join(dirname(fileURLToPath(import.meta.url)), "..", "..");
const require = createRequire(join(root, "data", "node", "package.json"));
let Template;
try {
  ({ Template } = require("@huggingface/jinja"));
} catch {
  console.error("chat_template_golden.mjs: @huggingface/jinja is missing: run scripts/fetch-node-tools.sh");
  process.exit(2);
}

const args = process.argv.slice(2);
const verbose = args.includes("--verbose");
const writeIndex = args.indexOf("--write-node");
const fixtures = join(root, "tests", "fixtures", "chat_templates");
const manifest = JSON.parse(readFileSync(join(fixtures, "templates.json"), "utf8"));
const groups = JSON.parse(readFileSync(join(fixtures, "conversations.json"), "utf8"));
const toolSets = groups.tool_sets;
const conversations = {};
for (const [group, list] of Object.entries(groups)) {
  if (group === "tool_sets") continue;
  for (const c of list) conversations[c.name] = c;
}
const golden = readFileSync(join(fixtures, "golden.jsonl"), "utf8")
  .split("\n")
  .filter((line) => line)
  .map((line) => JSON.parse(line));

const templates = {};
for (const t of manifest) templates[t.name] = t;

let same = 0;
const differences = [];
const nodeLines = [];
for (const line of golden) {
  const t = templates[line.template];
  const c = conversations[line.conversation];
  const data = {
    ...t.special_tokens,
    ...(c.variables ?? {}),
    messages: c.messages,
    tools: c.tools ? toolSets[c.tools] : null,
    documents: c.documents ?? null,
    add_generation_prompt: line.add_generation_prompt,
  };
  let got;
  try {
    const source = readFileSync(join(fixtures, "templates", `${line.template}.jinja`), "utf8");
    got = { text: new Template(source).render(data) };
  } catch (e) {
    got = { error: String(e.message ?? e) };
  }
  nodeLines.push(JSON.stringify({ template: line.template, conversation: line.conversation,
                                  add_generation_prompt: line.add_generation_prompt, ...got }));
  const agree = "error" in line ? "error" in got : got.text === line.text;
  if (agree) {
    ++same;
    continue;
  }
  differences.push({ line, got });
}

const byTemplate = {};
for (const d of differences) (byTemplate[d.line.template] ??= []).push(d);
for (const [name, list] of Object.entries(byTemplate)) {
  console.log(`${name}: ${list.length} differ (${[...new Set(list.map((d) => d.line.conversation))].join(", ")})`);
  if (!verbose) continue;
  const d = list[0];
  console.log(`  python: ${JSON.stringify(d.line.text ?? d.line.error).slice(0, 600)}`);
  console.log(`  node:   ${JSON.stringify(d.got.text ?? d.got.error).slice(0, 600)}`);
}
console.log(`${golden.length} renderings: ${same} agree with @huggingface/jinja, ${differences.length} differ`);
if (writeIndex >= 0) writeFileSync(args[writeIndex + 1], nodeLines.join("\n") + "\n");
