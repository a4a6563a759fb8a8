// The web page of `docsfab serve` driven in headless Chromium by playwright-core, as a person
// would use it: sign in (when the server wants a token), see a refused submission's sentence
// next to the form, submit a composition, watch its status become `succeeded`, open its report,
// submit a long run and cancel it with the keyboard, see `cancelled`, rerun the first run, and
// let axe-core check the WCAG 2.1 A/AA rules. tests/serve_web.rs starts the server and runs this.
//
// Environment (all set by serve_web.rs):
//   DOCSFAB_SERVE_URL          http://127.0.0.1:PORT of the server
//   DOCSFAB_PLAYWRIGHT_DIR     a directory with node_modules/playwright-core and axe-core
//   DOCSFAB_CHROMIUM           the browser (default /usr/bin/chromium)
//   DOCSFAB_WORKSPACE          the directory to submit as the workspace
//   DOCSFAB_QUICK_COMPOSITION  a composition file that succeeds quickly
//   DOCSFAB_LONG_COMPOSITION   a composition file whose run waits until cancelled
//   DOCSFAB_PROFILE            a fresh, empty directory for the browser profile
//   DOCSFAB_TOKEN              optional: the server's access token, entered on the sign-in page
//   DOCSFAB_SCREENSHOT         optional: where to save a PNG of the page at the end
// Prints one JSON line {"succeeded": ID, "cancelled": ID, "rerun": ID, ...} and exits 0, or
// exits 1 with the reason on stderr.

import fs from "node:fs";

import { WAIT_MS, accessibility, check, env, launch, row, waitForStatus } from "./browser.mjs";

const BASE = env("DOCSFAB_SERVE_URL");
const TOKEN = process.env.DOCSFAB_TOKEN;

async function main() {
  const context = await launch(env("DOCSFAB_PROFILE"));
  const problems = [];
  try {
    const page = context.pages()[0] ?? (await context.newPage());
    page.setDefaultTimeout(WAIT_MS);
    // A Content-Security-Policy that blocked the page's own script or style would show here.
    // The browser logs every 4xx answer as an error: the steps that provoke one on purpose say
    // so here (GET / answers 401 before signing in; a refused submission is a 400).
    let signingIn = TOKEN !== undefined;
    let refusing = false;
    page.on("console", (message) => {
      // The browser's own favicon request may 404; the page asks for nothing else.
      const where = message.location()?.url ?? "";
      const expected =
        where.endsWith("/favicon.ico") ||
        (signingIn && message.text().includes("401")) ||
        (refusing && where.endsWith("/api/runs") && message.text().includes("400"));
      if (message.type() === "error" && !expected) problems.push(`${message.text()} (${where})`);
    });
    page.on("pageerror", (error) => problems.push(String(error)));

    const result = {};
    let response = await page.goto(BASE + "/");
    if (TOKEN !== undefined) {
      check(response.status() === 401, `GET / without the token answered ${response.status()}, not 401`);
      result.axeRulesPassedOnSignIn = await accessibility(page, "the sign-in page");
      // A wrong token comes back to this page, which says so.
      await page.getByLabel("Access token").fill("not-" + TOKEN);
      await Promise.all([page.waitForEvent("load"), page.getByRole("button", { name: "Sign in" }).click()]);
      await page.locator("#token-error").filter({ hasText: "not accepted" }).waitFor();
      await page.getByLabel("Access token").fill(TOKEN);
      await Promise.all([page.waitForEvent("load"), page.getByRole("button", { name: "Sign in" }).click()]);
      signingIn = false;
      const html = await page.content();
      check(!html.includes(TOKEN), "the page shows the token after signing in");
      result.signedIn = true;
    } else {
      check(response.status() === 200, `GET / answered ${response.status()}`);
    }
    const csp = (await page.locator('meta[http-equiv="Content-Security-Policy"]').getAttribute("content")) ?? "";
    check(csp.includes("script-src 'sha256-"), `no hash-based policy on the page: ${csp}`);
    await page.getByRole("heading", { name: "Runs" }).waitFor();
    await page.getByRole("button", { name: "Submit run" }).waitFor();

    // Keyboard: the first Tab reaches the skip link, which moves focus to the list.
    await page.keyboard.press("Tab");
    check(
      (await page.evaluate(() => document.activeElement?.textContent)) === "Skip to the list of runs",
      "the first Tab does not reach the skip link",
    );

    // An empty form is refused on the page, next to the form.
    await page.getByRole("button", { name: "Submit run" }).click();
    const formError = page.locator("#form-error");
    check((await formError.textContent()).includes("Composition"), "an empty submit shows no error");

    // A submission the server refuses shows the server's sentence next to the form.
    await page.getByLabel("Composition (YAML)").fill(fs.readFileSync(env("DOCSFAB_QUICK_COMPOSITION"), "utf8"));
    await page.getByLabel("Directory", { exact: true }).fill("/");
    refusing = true;
    await page.getByRole("button", { name: "Submit run" }).click();
    await formError.filter({ hasText: "workspace" }).waitFor();
    refusing = false;
    result.refused = await formError.textContent();

    // Submit the quick composition and watch it succeed.
    const quick = await submit(page, fs.readFileSync(env("DOCSFAB_QUICK_COMPOSITION"), "utf8"));
    result.succeeded = quick;
    await waitForStatus(page, quick, "succeeded");
    check(
      (await page.locator("#announcer").textContent()).includes(`Run ${quick} `),
      "the status change was not announced in the live region",
    );
    check(
      await row(page, quick).getByRole("button", { name: `Rerun run ${quick}` }).isVisible(),
      "an ended run has no Rerun button",
    );

    // Its report opens from the row's link.
    await Promise.all([
      page.waitForURL((url) => url.pathname.endsWith("/report")),
      row(page, quick).getByRole("link", { name: `Report of run ${quick}` }).click(),
    ]);
    check((await page.title()).includes(quick), `the report's title is ${await page.title()}`);
    result.reportTitle = await page.title();
    await page.goBack();
    await page.getByRole("heading", { name: "Runs" }).waitFor();

    // Submit the long one; once it runs, cancel it from the keyboard.
    const long = await submit(page, fs.readFileSync(env("DOCSFAB_LONG_COMPOSITION"), "utf8"));
    await waitForStatus(page, long, "running");
    const cancel = row(page, long).getByRole("button", { name: `Cancel run ${long}` });
    await cancel.focus();
    // The list refreshes every second; a refresh must leave the focused button focused.
    await page.waitForResponse((r) => r.url().includes("/api/runs?"));
    await page.waitForResponse((r) => r.url().includes("/api/runs?"));
    check(await cancel.evaluate((b) => b === document.activeElement), "a refresh took the focus off the Cancel button");
    await page.keyboard.press("Enter");
    await waitForStatus(page, long, "cancelled");
    result.cancelled = long;
    // The row shows the attempt the cancel ended (status and count come from one list answer).
    result.cancelledAttempts = (await row(page, long).locator("td.num").nth(2).textContent()).trim(); // duration, steps, attempts
    check((await page.locator("#action-note").textContent()).includes(long), "the cancel outcome is not shown");

    // An ended run can be submitted again from its row.
    await row(page, quick).getByRole("button", { name: `Rerun run ${quick}` }).click();
    const again = page.locator("#action-note").filter({ hasText: `Run ${quick} submitted again as run ` });
    await again.waitFor();
    result.rerun = (await again.textContent()).split(" as run ")[1].replace(/\.$/, "");
    await row(page, result.rerun).waitFor();

    result.axeRulesPassed = await accessibility(page, "the page with runs");

    const shot = process.env.DOCSFAB_SCREENSHOT;
    if (shot) {
      await page.locator("#announcer").evaluate(() => window.scrollTo(0, 0));
      await page.screenshot({ path: shot, fullPage: true });
      result.screenshot = shot;
    }
    check(problems.length === 0, `the browser reported errors: ${problems.join(" | ")}`);
    process.stdout.write(JSON.stringify(result) + "\n");
  } finally {
    await context.close();
  }
}

/** Fills the form with `composition` and the workspace, submits, returns the new run id. */
async function submit(page, composition) {
  await page.getByLabel("Composition (YAML)").fill(composition);
  await page.getByLabel("A directory on the server").check();
  await page.getByLabel("Directory", { exact: true }).fill(env("DOCSFAB_WORKSPACE"));
  const [response] = await Promise.all([
    page.waitForResponse((r) => r.url().endsWith("/api/runs") && r.request().method() === "POST"),
    page.getByRole("button", { name: "Submit run" }).click(),
  ]);
  const body = await response.json();
  check(response.status() === 202, `submit answered ${response.status()}: ${JSON.stringify(body)}`);
  const id = String(body.runId);
  await page.locator("#form-note").filter({ hasText: id }).waitFor();
  check((await page.locator("#form-error").textContent()) === "", "an error is shown after a good submit");
  return id;
}

main().catch((error) => {
  process.stderr.write(`serve_page.mjs: ${error.stack || error}\n`);
  process.exit(1);
});
