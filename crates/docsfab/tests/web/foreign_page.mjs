// A page of another site, open in the same browser as the operator's, tries to use
// `docsfab serve` on loopback: it sends the "simple" cross-site requests a browser lets any page
// send without asking the server first (text/plain POSTs, mode no-cors), to queue a run and to
// cancel one, and it tries to read the run list. tests/serve_web.rs then checks the store:
// nothing may have changed.
//
// The page is served from http://localhost:PORT by this script, the server is at
// http://127.0.0.1:PORT: another host name, so another site, as a web page on the internet is.
//
// Environment: DOCSFAB_SERVE_URL, DOCSFAB_PLAYWRIGHT_DIR, DOCSFAB_CHROMIUM, DOCSFAB_PROFILE,
// DOCSFAB_WORKSPACE, DOCSFAB_QUICK_COMPOSITION, DOCSFAB_VICTIM_RUN (a queued run to cancel).
// Prints one JSON line with what the page could see, and exits 0; exits 1 on a test failure.

import { createRequire } from "node:module";
import fs from "node:fs";
import http from "node:http";
import path from "node:path";

const env = (name) => {
  const value = process.env[name];
  if (value === undefined) throw new Error(`foreign_page.mjs needs ${name}`);
  return value;
};
const require = createRequire(path.join(env("DOCSFAB_PLAYWRIGHT_DIR"), "package.json"));
const { chromium } = require("playwright-core");

const target = env("DOCSFAB_SERVE_URL");
const plan = {
  target,
  victim: env("DOCSFAB_VICTIM_RUN"),
  submission: JSON.stringify({
    composition: fs.readFileSync(env("DOCSFAB_QUICK_COMPOSITION"), "utf8"),
    workspace: { path: env("DOCSFAB_WORKSPACE") },
  }),
};

// The foreign page: fire the requests, then report in the title what came back.
const page = `<!DOCTYPE html><title>working</title><script>
const plan = ${JSON.stringify(plan).replace(/</g, "\\u003c")};
const simple = (path, body) => fetch(plan.target + path, { method: "POST", mode: "no-cors",
  headers: { "Content-Type": "text/plain" }, body, credentials: "include" })
  .then(() => "sent", (e) => "blocked: " + e);
(async () => {
  const out = {};
  out.submit = await simple("/api/runs", plan.submission);
  out.cancel = await simple("/api/runs/" + encodeURIComponent(plan.victim) + "/cancel", "");
  out.read = await fetch(plan.target + "/api/runs", { credentials: "include" })
    .then((r) => r.text().then((t) => "read " + t.length + " bytes"), (e) => "blocked: " + e);
  document.title = "done " + JSON.stringify(out);
})();
</script>`;

const server = http.createServer((req, res) => {
  res.writeHead(200, { "content-type": "text/html" });
  res.end(page);
});
await new Promise((resolve) => server.listen(0, "127.0.0.1", resolve));
const foreign = `http://localhost:${server.address().port}/`;

const context = await chromium.launchPersistentContext(env("DOCSFAB_PROFILE"), {
  executablePath: process.env.DOCSFAB_CHROMIUM ?? "/usr/bin/chromium",
  headless: true,
  args: [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
  ],
});
try {
  const tab = context.pages()[0] ?? (await context.newPage());
  // The operator signed in to the server earlier: the browser holds its cookie.
  if (process.env.DOCSFAB_TOKEN) {
    await context.addCookies([
      { name: "docsfab_token", value: process.env.DOCSFAB_TOKEN, url: target, sameSite: "Strict" },
    ]);
  }
  await tab.goto(foreign);
  await tab.waitForFunction(() => document.title.startsWith("done "), null, { timeout: 60_000 });
  const seen = JSON.parse((await tab.title()).slice("done ".length));
  process.stdout.write(JSON.stringify({ foreign, ...seen }) + "\n");
} catch (error) {
  process.stderr.write(`foreign_page.mjs: ${error.stack || error}\n`);
  process.exitCode = 1;
} finally {
  await context.close();
  server.close();
}
