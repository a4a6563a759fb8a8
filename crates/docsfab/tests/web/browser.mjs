// What the browser scripts of tests/serve_web.rs share: the environment, headless Chromium
// through playwright-core, axe-core, and finding a run's row and status on the page.
//
// DOCSFAB_PLAYWRIGHT_DIR names a directory with node_modules/playwright-core and axe-core;
// DOCSFAB_CHROMIUM the browser (default /usr/bin/chromium).

import { createRequire } from "node:module";
import fs from "node:fs";
import path from "node:path";

/** The variable `name`, or `fallback`; a missing one without a fallback is an error. */
export function env(name, fallback) {
  const value = process.env[name] ?? fallback;
  if (value === undefined) throw new Error(`the browser test needs ${name}`);
  return value;
}

export function check(condition, message) {
  if (!condition) throw new Error(message);
}

const require = createRequire(path.join(env("DOCSFAB_PLAYWRIGHT_DIR"), "package.json"));
const { chromium } = require("playwright-core");
// axe-core checks the WCAG 2.1 A/AA rules it can decide automatically (labels, names, contrast,
// roles). It is evaluated through the DevTools protocol, which the page's CSP does not govern.
const AXE = fs.readFileSync(require.resolve("axe-core/axe.min.js"), "utf8");

/** Generous: a run goes through a real server, store and simulator on a shared machine. */
export const WAIT_MS = 60_000;

/** Headless Chromium with the profile directory `profile`, no network services. */
export function launch(profile) {
  return chromium.launchPersistentContext(profile, {
    executablePath: env("DOCSFAB_CHROMIUM", "/usr/bin/chromium"),
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
    viewport: { width: 1280, height: 900 },
  });
}

/** Runs axe-core on the page as it is now; fails on any violation. Returns how many rules passed. */
export async function accessibility(page, where) {
  await page.evaluate(AXE);
  const result = await page.evaluate(() =>
    // eslint-disable-next-line no-undef
    axe.run(document, { runOnly: { type: "tag", values: ["wcag2a", "wcag2aa", "wcag21a", "wcag21aa"] } }),
  );
  const found = result.violations.map((v) => `${v.id} (${v.nodes.map((n) => n.target.join(" ")).join(", ")})`);
  check(found.length === 0, `${where} breaks accessibility rules (axe-core): ${found.join(" | ")}`);
  return result.passes.length;
}

/** The row of run `id` in the list of runs. */
export function row(page, id) {
  const exact = new RegExp("^" + id.replace(/[.*+?^${}()|[\]\\]/g, "\\$&") + "$");
  return page.locator("#runs-body tr").filter({ has: page.locator("th.id", { hasText: exact }) });
}

/** Waits until the row of run `id` shows `status`. */
export async function waitForStatus(page, id, status) {
  try {
    await row(page, id).locator("td.status").filter({ hasText: new RegExp(`\\b${status}$`) }).waitFor();
  } catch (error) {
    const now = await row(page, id).locator("td.status").textContent().catch(() => "(no row)");
    throw new Error(`run ${id} did not reach ${status} (it shows ${now}): ${error.message}`);
  }
}
