// Runs docs/_static/memory_widget.js's model in Node, without a page: test_widget_js.py sends a
// JSON list of calls on stdin ([name, ...args]: a function of MemoryWidget.model) and reads the
// results as JSON on stdout (BigInt as strings; {"error": message} for a call that throws). The
// widget's path is the first argument: guide.memory.widget.WIDGET_JS, the file the site ships.
"use strict";
const path = require("path");
const fs = require("fs");
// The widget mounts itself on DOMContentLoaded: a document still "loading" that never loads.
globalThis.window = globalThis;
globalThis.document = { readyState: "loading", addEventListener() {} };
require(path.resolve(process.argv[2]));
const M = globalThis.MemoryWidget.model;
const big = (k, v) => (typeof v === "bigint" ? v.toString() : v);
const revive = (v) => (typeof v === "string" && /^-?\d+n$/.test(v) ? BigInt(v.slice(0, -1)) : v);
const calls = JSON.parse(fs.readFileSync(0, "utf8"), (k, v) => revive(v));
const out = calls.map(([name, ...args]) => {
  try {
    return JSON.parse(JSON.stringify(M[name](...args), big) ?? "null");
  } catch (e) {
    return { error: String((e && e.stack) || e) };
  }
});
process.stdout.write(JSON.stringify(out));
