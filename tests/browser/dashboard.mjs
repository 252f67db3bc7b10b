// The dashboard in a real headless browser (Debian's chromium): load the Error list,
// open an order, press Retry, see it go Pending. Usage: node dashboard.mjs BASE_URL ORDER_ID
// Exits non-zero, saying what it saw, on any failure.
import { chromium } from "playwright-core";

const [base, orderId] = process.argv.slice(2);
const executablePath = process.env.CHROMIUM || "/usr/bin/chromium";
const browser = await chromium.launch({
  executablePath,
  headless: true,
  args: ["--no-sandbox", "--disable-dev-shm-usage"],
});
let code = 0;
try {
  const page = await browser.newPage();
  page.setDefaultTimeout(15000);
  // The token, given once, is kept in a cookie.
  await page.goto(`${base}/errors?token=${process.env.ORDERLY_DASHBOARD_TOKEN ?? ""}`);
  const row = page.locator("#errors tr", { hasText: orderId });
  await row.waitFor();
  const rowText = await row.innerText();
  if (!rowText.includes("card declined")) throw new Error(`Error list row lacks the error: ${rowText}`);
  // Search narrows the list.
  await page.fill("input[name=q]", "no such error text");
  await page.click("text=Search");
  if ((await page.locator("#errors tr", { hasText: orderId }).count()) !== 0) {
    throw new Error("the search did not filter the list");
  }
  await page.fill("input[name=q]", "declined");
  await page.click("text=Search");
  await page.click(`a:text("${orderId}")`);
  await page.waitForURL(`**/orders/${orderId}`);
  const state = await page.locator("#state").innerText();
  if (state !== "Error") throw new Error(`order page shows state ${state}`);
  const lastError = await page.locator("#last-error").innerText();
  if (!lastError.includes("card declined")) throw new Error(`last error: ${lastError}`);
  if ((await page.locator("#timeline tr").count()) < 4) throw new Error("timeline too short");
  await page.fill("form[action$=retry] input[name=reason]", "fixed the card (browser test)");
  await page.click("#retry");
  await page.waitForURL(`**/orders/${orderId}`);
  const after = await page.locator("#state").innerText();
  if (after !== "Pending") throw new Error(`after Retry the order shows ${after}`);
  const timeline = await page.locator("#timeline").innerText();
  if (!timeline.includes("fixed the card (browser test)")) throw new Error("the retry is not in the timeline");
  // A POST without the page's CSRF token is refused.
  const forged = await page.evaluate(async ([id]) => {
    const r = await fetch(`/orders/${id}/cancel`, {
      method: "POST",
      headers: { "content-type": "application/x-www-form-urlencoded" },
      body: "csrf=forged&reason=x",
    });
    return r.status;
  }, [orderId]);
  if (forged !== 403) throw new Error(`a forged POST got ${forged}`);
  console.log("ok: Error list, search, order page, retry -> Pending, CSRF refused");
} catch (e) {
  console.error(`browser test failed: ${e.message}`);
  code = 1;
} finally {
  await browser.close();
}
process.exit(code);
