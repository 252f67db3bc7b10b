// The operators' console in a real headless browser (Debian's chromium), after a run
// with failures: the overview's chart has data; the Errors page groups the failures by
// cause, and a cause's "Retry all" says how many orders it moves before it moves them;
// the filters and the search find an order; an order's alert and an alert about the
// system are acknowledged, and the
// list shows one acknowledged elsewhere without a reload; orders
// ticked in the list are cancelled, and all matching a filter retried; a screenshot of each page is written for
// review.
// Usage: node console.mjs BASE_URL SCREENSHOT_DIR PATTERN COUNT ORDER_ID CUSTOMER_ID ERRORS
// Exits non-zero, saying what it saw, on any failure.
import { chromium } from "playwright-core";
import { mkdirSync } from "node:fs";

const [base, shots, pattern, count, orderId, customer, errors] = process.argv.slice(2);
mkdirSync(shots, { recursive: true });
const executablePath = process.env.CHROMIUM || "/usr/bin/chromium";
const browser = await chromium.launch({
  executablePath,
  headless: true,
  args: ["--no-sandbox", "--disable-dev-shm-usage"],
});
const shot = async (page, name) => page.screenshot({ path: `${shots}/${name}.png`, fullPage: true });
let code = 0;
try {
  const page = await browser.newPage({ viewport: { width: 1280, height: 900 } });
  page.setDefaultTimeout(15000);

  // Overview: the chart of finished orders has bars.
  await page.goto(`${base}/`);
  const bars = await page.locator("#chart-finished rect.processed").count();
  if (bars < 1) throw new Error("the overview's chart of finished orders has no bar");
  if ((await page.locator("#chart-finished rect.error").count()) < 1) throw new Error("no Error bar in the chart");
  if ((await page.locator("#chart-latency circle.p99").count()) < 1) throw new Error("no latency drawn");
  await shot(page, "overview");

  // The week's charts, by hour: the link above the charts; the run's orders are in the
  // last hour's bar, and the redraw asks for the same range.
  await page.locator("#chart-ranges a", { hasText: "7 days" }).click();
  await page.waitForURL(/range=7d/);
  const heading = await page.locator("div.chart h2").first().innerText();
  if (!heading.startsWith("Finished per hour")) throw new Error(`the week's chart says ${heading}`);
  if ((await page.locator("#chart-finished rect.processed").count()) < 1) throw new Error("the week's chart has no bar");
  if ((await page.locator("#chart-ranges strong").innerText()) !== "7 days") throw new Error("the range shown is not marked");
  const redraw = await page.evaluate(async () => (await fetch("/charts" + location.search)).text());
  if (!redraw.includes("Finished per hour")) throw new Error("the redraw does not keep the week's range");
  await shot(page, "overview-7d");

  // Errors grouped by cause: every Error order is in one of the causes on the page,
  // and the cause's row says how many.
  await page.goto(`${base}/errors`);
  const counts = await page.locator("#groups tr.group td.n").allInnerTexts();
  const total = counts.reduce((a, n) => a + Number(n.trim()), 0);
  if (String(total) !== errors) throw new Error(`the causes hold ${total} orders, ${errors} are in Error`);
  const row = page.locator("#groups tr.group", { hasText: pattern });
  await row.waitFor();
  const n = (await row.locator("td.n").innerText()).trim();
  if (n !== count) throw new Error(`the cause's row says ${n} orders, expected ${count}`);
  await shot(page, "errors");
  await row.locator("a.retry-all").click();
  await page.waitForURL("**/errors/group?**");
  const confirmCount = (await page.locator("#confirm-count").innerText()).trim();
  if (confirmCount !== count) throw new Error(`the confirmation says ${confirmCount}, expected ${count}`);
  const what = await page.locator("#confirm-what").innerText();
  if (!what.includes("continue from the failed step") || !what.includes("run afresh")) {
    throw new Error(`the confirmation does not say what a retry does: ${what}`);
  }
  await page.fill("input[name=operator]", "erin");
  await shot(page, "retry-confirm");
  await page.click("#confirm");
  await page.locator("#moved").waitFor();
  const moved = (await page.locator("#moved").innerText()).trim();
  if (moved !== count) throw new Error(`moved ${moved} orders, expected ${count}`);
  await shot(page, "retry-done");
  await page.goto(`${base}/errors`);
  if ((await page.locator("#groups tr.group", { hasText: pattern }).count()) !== 0) {
    throw new Error("the retried cause is still listed");
  }

  // Filters: Pending orders of the customer include the retried order.
  await page.goto(`${base}/orders`);
  await page.selectOption("select[name=state]", "Pending");
  await page.fill("input[name=customer]", customer);
  await page.click("#filters button");
  await page.waitForURL("**/orders?**");
  const listed = await page.locator("#orders").innerText();
  if (!listed.includes(orderId)) throw new Error(`the filtered list lacks ${orderId}: ${listed}`);
  if (listed.includes("Processed")) throw new Error("the state filter let Processed orders through");
  await shot(page, "orders");

  // Search by id from the header opens the order, with its timeline drawn.
  await page.fill("header input[name=id]", orderId);
  await page.click("header button");
  await page.waitForURL(`**/orders/${orderId}`);
  if ((await page.locator("#order-timeline rect").count()) < 1) throw new Error("the order's timeline is empty");
  const history = await page.locator("#timeline").innerText();
  if (!history.includes("operator:erin")) throw new Error("the retry is not recorded under the operator's name");
  await shot(page, "order");

  // Alerts: an order's alert acknowledged, under the operator's name.
  await page.goto(`${base}/alerts`);
  const open = page.locator("#order-alerts tr", { has: page.locator("button.ack") }).first();
  const alertNo = (await open.locator("td").first().innerText()).trim();
  await open.locator("input[name=operator]").fill("erin");
  await Promise.all([
    page.waitForResponse((r) => r.url().endsWith("/alerts") && r.request().method() === "GET"),
    open.locator("button.ack").click(),
  ]);
  const acked = page
    .locator("#order-alerts tr")
    .filter({ has: page.locator("td:first-child", { hasText: new RegExp(`^${alertNo}$`) }) });
  const by = (await acked.locator("span.ack").innerText()).trim();
  if (by !== "operator:erin") throw new Error(`alert #${alertNo} acknowledged by ${by}, expected operator:erin`);
  if ((await acked.locator("button.ack").count()) !== 0) throw new Error("an acknowledged alert still offers Acknowledge");

  // An alert about the system acknowledged the same way: recorded, and still open.
  const condition = page.locator("#system-alerts tr", { has: page.locator("button.ack") }).first();
  const conditionNo = (await condition.locator("td").first().innerText()).trim();
  await condition.locator("input[name=operator]").fill("erin");
  await Promise.all([
    page.waitForResponse((r) => r.url().endsWith("/alerts") && r.request().method() === "GET"),
    condition.locator("button.ack").click(),
  ]);
  const seen = page
    .locator("#system-alerts tr")
    .filter({ has: page.locator("td:first-child", { hasText: new RegExp(`^${conditionNo}$`) }) });
  const seenBy = (await seen.locator("span.ack").innerText()).trim();
  if (seenBy !== "operator:erin") throw new Error(`system alert #${conditionNo} acknowledged by ${seenBy}`);
  if ((await seen.locator("b.bad").innerText()).trim() !== "open") throw new Error("an acknowledged system alert was resolved");
  await shot(page, "alerts");

  // Lists refresh in place: an alert acknowledged elsewhere (here through the JSON API)
  // shows as acknowledged within seconds, without a reload.
  await page.goto(`${base}/alerts`);
  const waiting = page.locator("#order-alerts tr", { has: page.locator("button.ack") }).first();
  const liveNo = (await waiting.locator("td").first().innerText()).trim();
  await page.evaluate(() => { window.notReloaded = true; });
  const acking = await page.request.post(`${base}/api/alerts/${liveNo}/ack`, { data: { operator: "erin" } });
  if (!acking.ok()) throw new Error(`the API refused to acknowledge #${liveNo}: ${acking.status()} ${await acking.text()}`);
  await page
    .locator("#order-alerts tr")
    .filter({ has: page.locator("td:first-child", { hasText: new RegExp(`^${liveNo}$`) }) })
    .locator("span.ack")
    .waitFor({ timeout: 12000 });
  if (!(await page.evaluate(() => window.notReloaded === true))) throw new Error("the alerts were reloaded, not refreshed in place");

  // Bulk from the orders list: two Error orders ticked and cancelled; then every Error
  // order left, "all matching the filters", retried after a confirmation that counts them.
  await page.goto(`${base}/orders?state=Error`);
  const rows = page.locator("#orders tr.order");
  const inError = await rows.count();
  if (inError < 3) throw new Error(`only ${inError} Error orders left for the bulk actions`);
  await rows.nth(0).locator("input[name=order]").check();
  await rows.nth(1).locator("input[name=order]").check();
  await page.fill("#bulk input[name=operator]", "erin");
  await shot(page, "bulk-selected");
  await page.click("#bulk-cancel");
  await page.locator("#bulk-moved").waitFor();
  const cancelled = (await page.locator("#bulk-moved").innerText()).trim();
  if (cancelled !== "2") throw new Error(`cancelled ${cancelled} of the 2 ticked orders`);
  await page.goto(`${base}/orders?state=Error`);
  const rest = await page.locator("#orders tr.order").count();
  if (rest !== inError - 2) throw new Error(`${rest} orders in Error after cancelling 2 of ${inError}`);
  await page.fill("#bulk input[name=operator]", "erin");
  await page.check("#bulk-all");
  await page.click("#bulk-retry");
  await page.locator("#bulk-count").waitFor();
  const asked = (await page.locator("#bulk-count").innerText()).trim();
  if (asked !== String(rest)) throw new Error(`the confirmation counts ${asked} matching orders, ${rest} are listed`);
  await shot(page, "bulk-confirm");
  await page.click("#bulk-confirm");
  await page.locator("#bulk-moved").waitFor();
  const retried = (await page.locator("#bulk-moved").innerText()).trim();
  if (retried !== String(rest)) throw new Error(`retried ${retried} of ${rest} matching orders`);
  await page.goto(`${base}/orders?state=Error`);
  if ((await page.locator("#orders tr.order").count()) !== 0) throw new Error("orders are still in Error after retrying all");

  for (const [name, path] of [["alerts", "/alerts"], ["dead-letters", "/dead-letters"]]) {
    await page.goto(`${base}${path}`);
    await shot(page, name);
  }
  const phone = await browser.newPage({ viewport: { width: 390, height: 844 } });
  await phone.goto(`${base}/`);
  await shot(phone, "overview-phone");
  console.log(`ok: charts drawn (hour and week), cause of ${count} retried after confirming, filters and search found ${orderId}, alert #${alertNo} and system alert #${conditionNo} acknowledged, #${liveNo} shown acknowledged by the live list, 2 ticked orders cancelled and ${rest} matching retried; screenshots in ${shots}`);
} catch (e) {
  console.error(`console test failed: ${e.message}`);
  code = 1;
} finally {
  await browser.close();
}
process.exit(code);
