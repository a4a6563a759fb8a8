// Issue 34: the Resume button of `docsfab serve`'s page and the lineage it leads to, driven in
// headless Chromium by playwright-core. A run whose last step failed is on the page (submitted
// through the API by tests/serve_web.rs); this script finds it, checks it offers Resume, clicks
// Resume, follows the new run to `succeeded`, checks the new run's row names the run it resumed
// (and offers no Resume, having succeeded), clicks that lineage link to the failed run's report,
// then opens the new run's report and reads its lineage: resumed from the failed run, each
// carried-over step reused from it. axe-core checks the WCAG 2.1 A/AA rules on every state.
//
// Environment (all set by serve_web.rs):
//   DOCSFAB_SERVE_URL       http://127.0.0.1:PORT of the server
//   DOCSFAB_PLAYWRIGHT_DIR  a directory with node_modules/playwright-core and axe-core
//   DOCSFAB_CHROMIUM        the browser (default /usr/bin/chromium)
//   DOCSFAB_PROFILE         a fresh, empty directory for the browser profile
//   DOCSFAB_FAILED_RUN      the run that failed (submitted through the API)
//   DOCSFAB_REUSED_STEPS    the ids of the steps the failed run finished, comma-separated
//   DOCSFAB_REPORT_FILE     where to save the resumed run's report as the server sent it
//   DOCSFAB_SCREENSHOT      optional: where to save a PNG of the page after the resume
// Prints one JSON line {"failed": ID, "resumed": ID, ...} and exits 0, or exits 1 with the
// reason on stderr.

import fs from "node:fs";

import { WAIT_MS, accessibility, check, env, launch, row, waitForStatus } from "./browser.mjs";

const BASE = env("DOCSFAB_SERVE_URL");
const FAILED = env("DOCSFAB_FAILED_RUN");
const REUSED = env("DOCSFAB_REUSED_STEPS").split(",");

async function main() {
  const context = await launch(env("DOCSFAB_PROFILE"));
  const problems = [];
  try {
    const page = context.pages()[0] ?? (await context.newPage());
    page.setDefaultTimeout(WAIT_MS);
    // Nothing here provokes an error answer: any console error is a failure (a CSP that blocked
    // the page's script, a refused resume), but the browser's own favicon request may 404.
    page.on("console", (message) => {
      const where = message.location()?.url ?? "";
      if (message.type() === "error" && !where.endsWith("/favicon.ico")) problems.push(`${message.text()} (${where})`);
    });
    page.on("pageerror", (error) => problems.push(String(error)));

    const result = { failed: FAILED };
    const response = await page.goto(BASE + "/");
    check(response.status() === 200, `GET / answered ${response.status()}`);
    await page.getByRole("heading", { name: "Runs" }).waitFor();

    // The failed run is listed as failed and offers Resume beside Rerun.
    await waitForStatus(page, FAILED, "failed");
    const resume = row(page, FAILED).getByRole("button", { name: `Resume run ${FAILED}`, exact: true });
    check(await resume.isVisible(), "a failed run has no Resume button");
    check(await row(page, FAILED).getByRole("button", { name: `Rerun run ${FAILED}` }).isVisible(), "a failed run has no Rerun button");
    result.axeRulesPassedFailed = await accessibility(page, "the page with a failed run");

    result.resumed = await clickResume(page, resume);
    await waitForStatus(page, result.resumed, "succeeded");
    Object.assign(result, await resumedRow(page, result.resumed));
    result.axeRulesPassedResumed = await accessibility(page, "the page with the resumed run");
    const shot = process.env.DOCSFAB_SCREENSHOT;
    if (shot) await page.screenshot({ path: shot, fullPage: true });

    // The lineage link opens the report of the run that was resumed.
    const lineage = row(page, result.resumed).getByRole("link", {
      name: `Report of run ${FAILED}, which run ${result.resumed} resumed`,
      exact: true,
    });
    await Promise.all([page.waitForURL((url) => url.pathname === `/api/runs/${FAILED}/report`), lineage.click()]);
    const failedFacts = await facts(page);
    check(failedFacts.run === FAILED && failedFacts.status === "failed", `the lineage link opened ${JSON.stringify(failedFacts)}`);
    await page.goBack();
    await page.getByRole("heading", { name: "Runs" }).waitFor();

    // The resumed run's report, from its row: resumed from the failed run, its finished steps
    // reused from it.
    const [report] = await Promise.all([
      page.waitForResponse((r) => r.url().endsWith(`/api/runs/${result.resumed}/report`)),
      row(page, result.resumed).getByRole("link", { name: `Report of run ${result.resumed}`, exact: true }).click(),
    ]);
    await page.locator("#run-facts dt").first().waitFor();
    fs.writeFileSync(env("DOCSFAB_REPORT_FILE"), await report.body());
    result.report = await facts(page);
    checkReportLineage(result.report, result.resumed);
    result.axeRulesPassedReport = await accessibility(page, "the resumed run's report");

    check(problems.length === 0, `the browser reported errors: ${problems.join(" | ")}`);
    process.stdout.write(JSON.stringify(result) + "\n");
  } finally {
    await context.close();
  }
}

/** Clicks the failed run's Resume button; returns the id of the run it queued. */
async function clickResume(page, button) {
  const [answer] = await Promise.all([
    page.waitForResponse((r) => r.url().endsWith(`/api/runs/${FAILED}/resume`) && r.request().method() === "POST"),
    button.click(),
  ]);
  const body = await answer.json();
  check(answer.status() === 202 && body.resumeOf === FAILED, `resume answered ${answer.status()}: ${JSON.stringify(body)}`);
  const id = String(body.runId);
  check(id !== FAILED, "the resume reused the failed run's id");
  await page.locator("#action-note").filter({ hasText: `Run ${FAILED} resumed as run ${id}.` }).waitFor();
  await row(page, id).waitFor();
  return id;
}

/** The resumed run's row: its lineage, counts and buttons, once it has succeeded. */
async function resumedRow(page, id) {
  const line = row(page, id).locator(".lineage");
  await line.filter({ hasText: `resumed from ${FAILED}` }).waitFor();
  check((await row(page, FAILED).locator(".lineage").count()) === 0, "the failed run shows a lineage");
  const cells = row(page, id).locator("td.num"); // duration, steps, attempts
  const shown = {
    lineage: (await line.textContent()).trim(),
    steps: (await cells.nth(1).textContent()).trim(),
    attempts: (await cells.nth(2).textContent()).trim(),
  };
  // A succeeded run cannot be resumed: the page offers Rerun only.
  check((await row(page, id).getByRole("button", { name: /^Resume run / }).count()) === 0, "a succeeded run offers Resume");
  check(await row(page, id).getByRole("button", { name: `Rerun run ${id}` }).isVisible(), "the resumed run has no Rerun button");
  // The failed run can still be resumed again.
  check(await row(page, FAILED).getByRole("button", { name: `Resume run ${FAILED}` }).isVisible(), "the failed run lost its Resume button");
  return shown;
}

/** The report's header facts, `dt` text to `dd` text. */
async function facts(page) {
  await page.locator("#run-facts dt").first().waitFor();
  return page.locator("#run-facts").evaluate((dl) => {
    const out = {};
    for (const dt of dl.querySelectorAll("dt")) out[dt.textContent] = dt.nextElementSibling?.textContent ?? null;
    return out;
  });
}

function checkReportLineage(shown, id) {
  const all = JSON.stringify(shown);
  check(shown.run === id && shown.status === "succeeded", `the report is not of the succeeded resume: ${all}`);
  check(shown["resumed from"] === `run ${FAILED}`, `the report does not say it resumed ${FAILED}: ${all}`);
  for (const step of REUSED) {
    const want = `from run ${FAILED} (${step}): inputs unchanged, no request sent`;
    check(shown[`reused ${step}`] === want, `the report does not show step ${step} reused: ${all}`);
  }
  const reused = Object.keys(shown).filter((k) => k.startsWith("reused "));
  check(reused.length === REUSED.length, `the report shows other steps reused: ${all}`);
}

main().catch((error) => {
  process.stderr.write(`resume_page.mjs: ${error.stack || error}\n`);
  process.exit(1);
});
